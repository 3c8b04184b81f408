"""What the run page's diff of two long runs costs the service (issue 40, E11).

A history store is filled with two runs of N steps (100,000 by default) of an actor role
reporting 40 metrics per step (``bench_page.fill``). Figures, each in a fresh process:
  * before: both runs' step lines read whole and diffed in the service's own process
    (``HistoryStore.steps`` and ``diff_runs``, what ``/api/diff`` did before the bound): the
    time, and the peak memory of that process;
  * after: ``/api/diff`` as the service answers it now (at most 400,000 values per run, in a
    child process): the first answer's time, the service process's peak memory and the child's,
    and a second request (the cache);
  * /metrics while a diff is computed: a scrape every 20 ms for as long as the diff runs, before
    (in a server thread, as it was) and after (in the child): the median and the worst scrape.
Each is printed with its ratio to the "before" figure.

Run: ``python bench/bench_page_diff.py [--steps 100000]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_page import RUN, RUN_B, fill

_CHILD = r"""
import json, resource, sys, threading, time, urllib.request
from pathlib import Path
from rlmon.service.export.exporter import MetricsState
from rlmon.service.export.http import serve_metrics
from rlmon.service.storage.history import HistoryStore
from rlmon.service.web.api import WebApi
from rlmon.service.web.server import WebApp

path, mode, a, b = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
reader = HistoryStore(path, read_only=True)
api = WebApi(reader)
if mode == "before":
    from rlmon.service.diff import diff_runs
    from rlmon.service.diff.runs import from_step_lines

    def whole(a, b):
        return diff_runs(*(from_step_lines(reader.steps(r), r, "history store")
                           for r in (a, b))).to_json()
    api.diffs._compute = whole
server = serve_metrics(MetricsState(), port=0, host="127.0.0.1", web=WebApp(api))
done, out = threading.Event(), {}

def diff():
    t0 = time.perf_counter()
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{server.port}/api/diff?a={a}&b={b}",
                               timeout=900).read()
    finally:  # an error ends the scrapes too (and the run, below)
        out["first"] = time.perf_counter() - t0
        done.set()

base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
threading.Thread(target=diff).start()
scrapes = []
while not done.is_set():
    t0 = time.perf_counter()
    urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=600).read()
    scrapes.append(time.perf_counter() - t0)
    done.wait(0.02)
t0 = time.perf_counter()
urllib.request.urlopen(f"http://127.0.0.1:{server.port}/api/diff?a={a}&b={b}", timeout=600).read()
out["cached"] = time.perf_counter() - t0
out["scrapes"] = scrapes
out["rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
out["rss_before_mb"] = base / 1024
out["child_rss_mb"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
out["computed"] = api.diffs.computed
server.close()
print(json.dumps(out))
"""


def measure(path: Path, mode: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-c", _CHILD, str(path), mode, RUN, RUN_B],
                          capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(
                              [str(Path(__file__).resolve().parents[1]),
                               os.environ.get("PYTHONPATH", "")])})
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=100_000)
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f}; Python {platform.python_version()}")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "history.sqlite"
        t0 = time.perf_counter()
        fill(path, args.steps, RUN)
        fill(path, args.steps, RUN_B)
        print(f"two runs of {args.steps:,} steps x 40 metrics stored in "
              f"{time.perf_counter() - t0:.0f} s")
        before, after = measure(path, "before"), measure(path, "after")
    for name, got in (("before", before), ("after", after)):
        scrapes = sorted(got["scrapes"])
        print(f"{name:>6}: first /api/diff {got['first']:.2f} s, again {got['cached']:.3f} s; "
              f"service process peak {got['rss_mb']:.0f} MB (started at "
              f"{got['rss_before_mb']:.0f} MB), child process peak {got['child_rss_mb']:.0f} MB; "
              f"/metrics during the diff: {len(scrapes)} scrapes, median "
              f"{statistics.median(scrapes) * 1e3:.1f} ms, worst {scrapes[-1] * 1e3:.1f} ms")
    grown = [g["rss_mb"] - g["rss_before_mb"] for g in (before, after)]
    print(f"ratios after/before: first answer {after['first'] / before['first']:.2f}x; "
          f"service memory growth {grown[1]:.0f} MB vs {grown[0]:.0f} MB "
          f"({grown[1] / max(grown[0], 1e-9):.3f}x); worst /metrics scrape "
          f"{max(after['scrapes']) / max(before['scrapes']):.2f}x")


if __name__ == "__main__":
    main()
