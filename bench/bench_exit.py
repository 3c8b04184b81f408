"""What rlmon adds to a process's exit: a script that falls off its end straight after its last
``end_step`` (no ``flush``, no ``close``), run as a user runs it, N times per case; the figure is
the time from its last line to the parent seeing it exit, against the same script without rlmon
(the interpreter's own exit) run in the same process.

Cases: the exit budget (``RLMON_EXIT_TIMEOUT``) of 2 s while rlmon's local Ray is still starting;
the same with ``RAY_ADDRESS`` naming a Ray that does not answer; and a Ray that is up (the script
flushed first: the exit sends the closing heartbeat, finalizes the runtime and stops the local Ray
whole), with the default budget. After each run, the Ray processes of its session still alive
are counted (none expected).

    python bench/bench_exit.py [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SCRIPT = """
import time
{reporter}
for step in range(5):
    {record}
{flush}
print("last line at", time.time(), flush=True)
"""
WITH = dict(reporter="from rlmon import Reporter\nrep = Reporter('exit-bench', 'actor')",
            record="rep.record('actor/loss', sum=1.0, count=1.0); rep.end_step(step)")
WITHOUT = dict(reporter="", record="pass", flush="")

CASES = {  # name: (script fields, budget, extra environment)
    "no rlmon (the interpreter's exit)": (WITHOUT, "60", {}),
    "budget 2 s, local Ray starting": ({**WITH, "flush": ""}, "2", {}),
    "budget 2 s, RAY_ADDRESS unreachable": ({**WITH, "flush": ""}, "2",
                                           {"RAY_ADDRESS": "127.0.0.1:9"}),
    "budget 60 s, Ray up (flushed)": ({**WITH, "flush": "assert rep.flush(300)"}, "60", {}),
}


def _left_under(root: str) -> int:
    found = 0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if root in (proc / "cmdline").read_bytes().decode(errors="replace"):
                found += 1
        except OSError:
            continue
    return found


def run_once(fields: dict[str, str], budget: str, extra: dict[str, str]) -> tuple[float, int]:
    """Seconds from the script's last line to its exit; Ray processes of its session left."""
    ray_tmp = tempfile.mkdtemp(prefix="rb-", dir="/tmp")
    state = tempfile.mkdtemp(prefix="rb-state-")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RLMON_", "RAY_ADDRESS"))}
    env.update(RAY_TMPDIR=ray_tmp, RLMON_STATE_DIR=state, RLMON_PORT="0",
               RAY_DISABLE_USAGE_STATS="1", RLMON_EXIT_TIMEOUT=budget, RLMON_RAY_CONNECT_TIMEOUT="600",
               **extra)
    try:
        done = subprocess.run([sys.executable, "-c", SCRIPT.format(**fields)], env=env,
                              capture_output=True, text=True, timeout=600, check=False)
        exited = time.time()
        left = _left_under(ray_tmp)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
        shutil.rmtree(state, ignore_errors=True)
    if "last line at" not in done.stdout:
        raise RuntimeError(f"the script failed ({done.returncode}): {done.stderr[-2000:]}")
    return exited - float(done.stdout.split("last line at ")[1].split()[0]), left


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    print(f"exit after the script's last line, median (max) of {args.runs} runs, "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    base = None
    for name, (fields, budget, extra) in CASES.items():
        runs = [run_once(fields, budget, extra) for _ in range(args.runs)]
        took = [t for t, _ in runs]
        median = statistics.median(took)
        base = median if base is None else base
        print(f"  {name:<40} {median:6.2f} s ({max(took):5.2f})  rlmon adds {median - base:5.2f} s"
              f"  Ray processes left: {sum(n for _, n in runs)}")


if __name__ == "__main__":
    main()
