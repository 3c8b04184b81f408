"""``rlmon export`` of a long run: a history store holding a million steps of one role.

Figures: the wall time and peak RSS of ``rlmon export RUN --format parquet`` and ``--format
csv`` in a fresh process, against the baseline of the same process reading the run the way a
notebook could before (``HistoryStore.steps(run)``: every step line parsed into memory, then a
DataFrame of its metrics), all measured here in the same run. The store is built in a temporary
directory through the history store's own writer (``HistoryStore.add``), 16 metrics a step (the
actor's key curves and a few more), about 1 kB a step on disk.

Run: ``python bench/bench_export.py [--steps 1000000]``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RUN = "bench-run"

_MEASURE = """
import json, resource, sys, time
start = time.perf_counter()
what, state, out = sys.argv[1], sys.argv[2], sys.argv[3]
if what in ("parquet", "csv"):
    from rlmon.cli import main
    code = main(["export", "bench-run", "--state-dir", state, "--format", what, "-o", out])
else:
    import pandas as pd
    from rlmon.service.storage.history import HistoryStore
    store = HistoryStore(state + "/history.sqlite", read_only=True)
    lines = store.steps("bench-run")
    frame = pd.DataFrame([line["metrics"] for line in lines])
    code = 0 if len(frame) == len(lines) else 1
print(json.dumps({"seconds": time.perf_counter() - start, "code": code,
                  "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

METRICS = ("actor/loss", "actor/kl", "actor/entropy", "actor/clip_ratio", "actor/is_ratio",
           "actor/is_ratio_min", "actor/is_ratio_max", "actor/logp_diff", "actor/logp_diff_max",
           "actor/grad_norm", "actor/lr", "rollout/reward", "rollout/response_length",
           "rollout/tokens", "rollout/policy_lag", "perf/step_seconds")


def build(state: Path, steps: int, seed: int = 0) -> float:
    """The store, written in batches of 10,000 steps as the service writes them; seconds."""
    from rlmon.service.contract.step_record import StepRecord
    from rlmon.service.storage.history import HistoryStore

    rng = random.Random(seed)
    start = time.perf_counter()
    store = HistoryStore(state / "history.sqlite")
    batch = []
    for step in range(steps):
        metrics = {name: rng.gauss(1.0, 0.1) for name in METRICS}
        if step % 1000 == 999:
            metrics["actor/grad_norm"] = math.nan
        batch.append(StepRecord(RUN, "actor", step, True, 8, 8, (), metrics,
                                finalized_at=1_700_000_000.0 + step))
        if len(batch) == 10_000:
            store.add(batch)
            batch = []
    if batch:
        store.add(batch)
    store.close()
    return time.perf_counter() - start


def measure(what: str, state: Path, out: Path) -> dict[str, float]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(__file__).resolve().parent.parent), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", _MEASURE, what, str(state), str(out)],
                          capture_output=True, text=True, env=env, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--no-baseline", action="store_true",
                        help="skip the read-everything baseline (it needs memory)")
    parser.add_argument("--store", type=Path, default=None,
                        help="keep the built store in this directory and reuse it next time")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        state = args.store or Path(tmp)
        state.mkdir(parents=True, exist_ok=True)
        if (state / "history.sqlite").exists():
            print("store: reused")
        else:
            seconds = build(state, args.steps)
            print(f"store: built in {seconds:.1f} s")
        size = (state / "history.sqlite").stat().st_size / 2**20
        print(f"store: {args.steps:,} steps of {len(METRICS)} metrics, {size:,.0f} MiB")
        results = {}
        for what in ("parquet", "csv", *(() if args.no_baseline else ("baseline",))):
            out = Path(tmp) / f"out.{what}"
            results[what] = figures = measure(what, state, out)
            extra = f", file {out.stat().st_size / 2**20:,.0f} MiB" if out.exists() else ""
            print(f"{what:8s}: {figures['seconds']:7.1f} s, peak RSS "
                  f"{figures['peak_mib']:7.0f} MiB{extra}")
        if "baseline" in results:
            base = results["baseline"]["peak_mib"]
            for what in ("parquet", "csv"):
                print(f"{what} export / baseline peak RSS: "
                      f"{results[what]['peak_mib'] / base:.2f}")


if __name__ == "__main__":
    main()
