"""``rlmon diagnose --html`` of a long log against the text output of the same log.

Figures: the wall time and peak RSS of ``rlmon diagnose FILE`` (the terminal text) and of
``rlmon diagnose FILE --html OUT`` (the text and the page), each in a fresh process, on the same
``trainer_state.json`` as ``bench_diagnose.py`` builds (TRL's keys, a million entries by
default), and the ratios html / text; issue 40 asks for at most 1.5x in both. ``--pythonpath``
runs another checkout's rlmon (the figures before a change).

Run: ``python bench/bench_diagnose_html.py [--entries 1000000] [--pythonpath DIR]``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

_MEASURE = """
import contextlib, io, json, resource, sys, time
from rlmon.cli import main
start = time.perf_counter()
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    code = main(["diagnose", *sys.argv[1:]])
print(json.dumps({"seconds": time.perf_counter() - start, "code": code,
                  "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def _build() -> object:
    spec = importlib.util.spec_from_file_location(
        "bench_diagnose", Path(__file__).with_name("bench_diagnose.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build


def measure(args: list[str], cwd: Path, pythonpath: str | None) -> dict[str, float]:
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    out = subprocess.run([sys.executable, "-c", _MEASURE, *args], env=env, cwd=cwd,
                         capture_output=True, text=True, check=True)
    result: dict[str, float] = json.loads(out.stdout.splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--pythonpath", default=None,
                        help="run the rlmon of this checkout (PYTHONPATH), e.g. the one before")
    args = parser.parse_args()
    build = _build()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trainer_state.json"
        build(path, args.entries)  # type: ignore[operator]
        print(f"trainer_state.json: {args.entries:,} entries, "
              f"{path.stat().st_size / 2**20:.0f} MiB")
        text = measure([str(path)], Path(tmp), args.pythonpath)
        page = Path(tmp) / "diagnose.html"
        html = measure([str(path), "--html", str(page)], Path(tmp), args.pythonpath)
        print(f"text:   {text['seconds']:.1f} s, peak RSS {text['peak_mib']:.0f} MiB")
        print(f"--html: {html['seconds']:.1f} s, peak RSS {html['peak_mib']:.0f} MiB "
              f"(page {page.stat().st_size / 2**10:.0f} KiB)")
        print(f"ratio html/text: time {html['seconds'] / text['seconds']:.2f}x, "
              f"memory {html['peak_mib'] / text['peak_mib']:.2f}x (issue 40: at most 1.5x)")


if __name__ == "__main__":
    main()
