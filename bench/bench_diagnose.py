"""``rlmon diagnose`` of a long log: a Hugging Face ``trainer_state.json`` of a million entries.

Figures: the wall time and peak RSS of ``rlmon diagnose FILE --json`` in a fresh process, against
the baseline of the same process only parsing the file with ``json.load`` (what the reader did
first before it streamed the history), both measured here in the same run. The file is built in
a temporary directory: per entry the keys TRL's GRPOTrainer logs (loss, grad norm, learning rate,
reward and its spread, entropy, KL, epoch, step), about 190 bytes an entry, as the issue's file.

Run: ``python bench/bench_diagnose.py [--entries 1000000]``; ``--pythonpath DIR`` runs another
checkout's rlmon (the figures before a change).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

_MEASURE = """
import json, resource, sys, time
start = time.perf_counter()
if sys.argv[1] == "diagnose":
    import contextlib, io
    from rlmon.cli import main
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        code = main(["diagnose", sys.argv[2], "--json"])
else:
    with open(sys.argv[2]) as handle:
        json.load(handle)
    code = 0
print(json.dumps({"seconds": time.perf_counter() - start, "code": code,
                  "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def build(path: Path, entries: int, seed: int = 0) -> None:
    """A trainer state as the Trainer writes it (``json.dump``, sorted keys), healthy."""
    rng = random.Random(seed)
    with path.open("w") as out:
        out.write(f'{{"global_step": {entries}, "log_history": [')
        for step in range(1, entries + 1):
            entry = {"entropy": round(2.0 + 0.01 * rng.gauss(0, 1), 6),
                     "epoch": round(step / entries, 6),
                     "grad_norm": round(1.0 + 0.1 * rng.random(), 6),
                     "kl": round(0.01 + 0.001 * rng.random(), 6),
                     "learning_rate": 1e-5 * (1 - step / (entries + 1)),
                     "loss": round(0.02 * rng.gauss(0, 1), 6),
                     "reward": round(0.3 + 0.02 * rng.gauss(0, 1), 6),
                     "reward_std": round(0.4 + 0.02 * rng.random(), 6), "step": step}
            out.write(("," if step > 1 else "") + json.dumps(entry, sort_keys=True))
        out.write(f'], "max_steps": {entries}}}\n')


def measure(what: str, path: Path, pythonpath: str | None) -> dict[str, float]:
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    # run outside the repository, so the rlmon imported is the installed (or the given) one
    out = subprocess.run([sys.executable, "-c", _MEASURE, what, str(path)], env=env,
                         cwd=path.parent, capture_output=True, text=True, check=True)
    result: dict[str, float] = json.loads(out.stdout.splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--pythonpath", default=None,
                        help="run the rlmon of this checkout (PYTHONPATH), e.g. the one before")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trainer_state.json"
        build(path, args.entries)
        size = path.stat().st_size / 2**20
        print(f"trainer_state.json: {args.entries:,} entries, {size:.0f} MiB")
        floor = measure("json.load", path, args.pythonpath)
        print(f"baseline, json.load of the file: {floor['seconds']:.1f} s, "
              f"peak RSS {floor['peak_mib']:.0f} MiB")
        got = measure("diagnose", path, args.pythonpath)
        print(f"rlmon diagnose --json: {got['seconds']:.1f} s (exit {got['code']:.0f}), "
              f"peak RSS {got['peak_mib']:.0f} MiB; "
              f"{got['seconds'] / floor['seconds']:.1f}x the time and "
              f"{got['peak_mib'] / floor['peak_mib']:.2f}x the memory of json.load; "
              f"{got['seconds'] / args.entries * 1e6:.0f} us an entry")


if __name__ == "__main__":
    main()
