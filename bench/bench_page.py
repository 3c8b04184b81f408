"""How fast the run page loads a long run: the API's answer and the browser's rendering.

A history store is filled with one run of N steps (10,000 and 100,000 by default) of an actor
role of 8 ranks reporting 40 metrics per step (the key curves among them; each with its ranks'
extremes, as the aggregator keeps them for the page's band) and a few alert transitions, and a
service is started on it, as the page meets it. Figures, for each N:
  * the baseline: every step line of the (run, role) read and parsed as the CLI commands and the
    demo's plot do (HistoryStore.steps), which is what a page without server-side
    downsampling would start from (and then ship every point to the browser);
  * the curves' first read of the run by a fresh connection (nothing cached: a service that has
    just started), from the key-curve rows the history store packs beside each step, and, as
    before those rows existed, from the step lines (SQLite pulls the key metrics out of ~200 MB
    of JSON: the same store with its packed rows deleted, as an older rlmon left it, read
    read-only); each with the OS page cache warm and, when this process may drop it (root),
    dropped;
  * what keeping those rows costs: the history write per step (alert transitions wait for it
    before they are handed to the outbox) and the packed rows' share of it; packing the rows of
    the store's existing steps once (a store written by an older rlmon, on its first open);
  * GET /api/curves once the service has them cached (it keeps the most recently active runs'
    columns warm in the background; a reload, a zoom, another viewer);
  * GET /api/runs (what the page polls every 2 s);
  * the JSON the page downloads against the full series' JSON;
  * with Chromium (Debian's, via Playwright; skipped without it): navigation to every panel
    drawn, right after the service started (racing its warm-up) and once warmed; and, once
    warmed, the same with a metric outside the key curves picked by name (read from the step
    lines the first time it is asked for, then cached) and with a second run of the same length
    overlaid (issue 31);
  * GET /api/metrics (the picker's list of every metric), its first read and once known.
Each is printed with its ratio to the baseline. The budget: a 100,000-step run loads in about a
second.

Run: ``python bench/bench_page.py [--steps 10000 100000] [--no-browser]``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from rlmon.service.alerting.engine import AlertEvent
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.metrics import catalog
from rlmon.service.service_core import ServiceCore
from rlmon.service.storage import curve_rows
from rlmon.service.storage.history import HistoryStore
from rlmon.service.web.api import WebApi

RUN, ROLE = "bench-run", "actor"
RUN_B = "bench-run-b"  # overlaid
KEY = (catalog.IS_RATIO, catalog.IS_RATIO_MIN, catalog.IS_RATIO_MAX, catalog.LOGP_DIFF,
       catalog.LOGP_DIFF_MAX, catalog.KL, catalog.ENTROPY, catalog.CLIP_RATIO, catalog.GRAD_NORM,
       catalog.STEP_SECONDS)
OTHER = (catalog.LOSS, catalog.LR, catalog.APPROX_KL, catalog.ADVANTAGE, catalog.PPO_RATIO,
         *(f"actor/extra_{i:02d}" for i in range(40 - len(KEY) - 5)))
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


def fill(path: Path, steps: int, run: str = RUN) -> float:
    """One run of ``steps`` steps; an alert fires and resolves every 5,000 steps. Returns the
    seconds spent in the history store's writes."""
    store = HistoryStore(path)
    writing = 0.0
    names = KEY + OTHER
    t0 = time.time() - steps
    batch = 2_000
    for first in range(0, steps, batch):
        records, events = [], []
        for s in range(first, min(first + batch, steps)):
            values = {n: 1.0 + 0.5 * math.sin(s / 300.0 + i) + 0.01 * ((s * 7919 + i) % 13)
                      for i, n in enumerate(names)}
            records.append(StepRecord(run, ROLE, s, True, 8, 8, (), values,
                                      finalized_at=t0 + s, rank_extremes={
                                          n: (0.9 * v, 1.1 * v) for n, v in values.items()}))
            if s % 5_000 == 2_500:
                events.append(AlertEvent(run, ROLE, s, "KLDivergence", "warning", "firing",
                                         catalog.KL, values[catalog.KL]))
            if s % 5_000 == 3_000:
                events.append(AlertEvent(run, ROLE, s, "KLDivergence", "warning", "resolved",
                                         catalog.KL, values[catalog.KL]))
        started = time.perf_counter()
        store.add(records, events)
        writing += time.perf_counter() - started
    store.close()
    return writing


def curve_rows_cost(path: Path, records: list[StepRecord]) -> float:
    """Seconds to pack and insert the key-curve rows of ``records`` (what HistoryStore.add does
    for them on top of the step lines), in a transaction of their own on a copy of the table."""
    db = sqlite3.connect(path, isolation_level=None)
    try:
        db.execute("CREATE TABLE rows_copy (run TEXT NOT NULL, role TEXT NOT NULL, attempt "
                   "INTEGER NOT NULL, step INTEGER NOT NULL, vals BLOB NOT NULL, PRIMARY KEY "
                   "(run, role, attempt, step)) WITHOUT ROWID")
        started = time.perf_counter()
        db.execute("BEGIN")
        db.executemany("INSERT OR IGNORE INTO rows_copy VALUES (?, ?, ?, ?, ?)",
                       [(r.run, r.role, r.attempt, r.step, curve_rows.pack(r.metrics))
                        for r in records])
        db.execute("COMMIT")
        elapsed = time.perf_counter() - started
        db.execute("DROP TABLE rows_copy")
        return elapsed
    finally:
        db.close()


def drop_page_cache() -> bool:
    """Empty the OS page cache (root only); False where this process may not."""
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        return False
    return True


def first_read(path: Path, dropped: bool, endpoint: str = "/api/curves") -> float | None:
    """Seconds for GET /api/curves (or ``endpoint``) of the run through a fresh read-only
    connection."""
    if dropped and not drop_page_cache():
        return None
    reader = HistoryStore(path, read_only=True)
    try:
        started = time.perf_counter()
        WebApi(reader).handle(endpoint, {"run": RUN, "role": ROLE})
        return time.perf_counter() - started
    finally:
        reader.close()


def forget_curve_rows(path: Path) -> None:
    """The store as an rlmon from before the packed key curves left it."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("DELETE FROM curve_rows")
    db.execute("DELETE FROM curve_layout")
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()


def timed_get(url: str) -> tuple[float, bytes]:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=120) as resp:
        body = resp.read()
    return time.perf_counter() - started, body


def browser_load(chromium: Any, base: str, view: str = "") -> float:
    """Seconds from navigation to every panel drawn (uPlot's first draw sets data-onsets);
    ``view``: more of the address (picked metrics, overlays)."""
    page = chromium.new_page(viewport={"width": 1400, "height": 1000})
    try:
        started = time.perf_counter()
        page.goto(f"{base}#/run/{RUN}?role={ROLE}{view}")
        page.wait_for_function(
            "() => { const p = document.querySelectorAll('#panels .panel');"
            " return p.length > 0 && [...p].every(e => e.dataset.onsets !== undefined); }",
            timeout=120_000)
        return time.perf_counter() - started
    finally:
        page.close()


def bench(steps: int, chromium: Any | None) -> dict[str, Any]:
    state = Path(tempfile.mkdtemp(prefix="rlmon-bench-page-"))
    try:
        path = state / "history.sqlite"
        out: dict[str, Any] = {"add": fill(path, steps) / steps}
        sample = [StepRecord(RUN, ROLE, s, True, 8, 8, (), {n: 1.0 for n in KEY + OTHER})
                  for s in range(steps, steps + 2_000)]
        out["curve_rows"] = curve_rows_cost(path, sample) / len(sample)
        reader = HistoryStore(path, read_only=True)
        started = time.perf_counter()
        lines = reader.steps(RUN, ROLE)
        full = {n: [[ln["step"], ln["metrics"].get(n)] for ln in lines] for n in KEY}
        out["baseline"] = time.perf_counter() - started
        out["full_bytes"] = len(json.dumps(full))
        reader.close()
        del lines, full
        # the first read of the run, nothing cached (a service that has just started): as an
        # older rlmon read it (from the step lines), then from the packed rows
        forget_curve_rows(path)
        out["cold_lines"] = first_read(path, False)
        out["cold_lines_dropped"] = first_read(path, True)
        started = time.perf_counter()
        HistoryStore(path).close()  # the first open after the upgrade packs the stored steps
        out["backfill"] = time.perf_counter() - started
        out["cold"] = first_read(path, False)
        out["names_first"] = first_read(path, False, "/api/metrics")
        out["cold_dropped"] = first_read(path, True)
        if chromium is not None:  # right after a start, racing the warm-up
            for key, dropped in (("page_start", False), ("page_start_dropped", True)):
                if dropped and not drop_page_cache():
                    continue
                core = ServiceCore(state_dir=state, port=0, host="127.0.0.1").start()
                try:
                    out[key] = browser_load(chromium, f"http://127.0.0.1:{core.port}/")
                finally:
                    core.close(0.0)
        core = ServiceCore(state_dir=state, port=0, host="127.0.0.1").start()
        base = f"http://127.0.0.1:{core.port}/"
        try:
            warmer = core.ports.warmer
            deadline = time.monotonic() + 120
            while not len(warmer.api.columns) and time.monotonic() < deadline:
                time.sleep(0.05)
            _, body = timed_get(f"{base}api/curves?run={RUN}&role={ROLE}")
            out["bytes"] = len(body)
            out["points"] = max(len(p["x"]) for p in json.loads(body)["panels"])
            out["warm"] = statistics.median(
                timed_get(f"{base}api/curves?run={RUN}&role={ROLE}")[0] for _ in range(5))
            out["runs"] = statistics.median(timed_get(f"{base}api/runs")[0] for _ in range(5))
            out["names"] = statistics.median(
                timed_get(f"{base}api/metrics?run={RUN}&role={ROLE}")[0] for _ in range(5))
            if chromium is not None:
                out["page_warm"] = statistics.median(browser_load(chromium, base)
                                                     for _ in range(3))
                picked = f"&m={OTHER[-1].replace('/', '%2F')}"
                out["page_picked_first"] = browser_load(chromium, base, picked)
                out["page_picked"] = statistics.median(browser_load(chromium, base, picked)
                                                       for _ in range(3))
                fill(path, steps, RUN_B)
                browser_load(chromium, base, f"&with={RUN_B}")  # its first read
                out["page_overlay"] = statistics.median(
                    browser_load(chromium, base, f"&with={RUN_B}") for _ in range(3))
        finally:
            core.close(0.0)
        return out
    finally:
        shutil.rmtree(state, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--no-browser", action="store_true")
    args = parser.parse_args(argv)
    chromium_path = None if args.no_browser else shutil.which("chromium")
    print(f"machine: {platform.machine()}, {platform.processor() or platform.system()}, "
          f"Python {platform.python_version()}; one (run, role) of {len(KEY + OTHER)} metrics "
          f"per step, {len(KEY)} of them drawn")
    if chromium_path is None:
        print("  (no chromium, or --no-browser: the browser figures are left out)")
    results = {}
    if chromium_path is not None:
        try:
            from playwright.sync_api import sync_playwright
        except ImportError:
            print("  (no playwright: the browser figures are left out)")
            chromium_path = None
    if chromium_path is not None:
        with sync_playwright() as pw:
            chromium = pw.chromium.launch(executable_path=chromium_path, args=CHROMIUM_ARGS)
            try:
                for n in args.steps:
                    results[n] = bench(n, chromium)
            finally:
                chromium.close()
    else:
        for n in args.steps:
            results[n] = bench(n, None)
    for n, r in results.items():
        base = r["baseline"]
        print(f"{n:,} steps:")
        print(f"  baseline: read and parse every step line  {base * 1e3:9.0f} ms")
        for what, key in (("from the step lines (before)", "cold_lines"),
                          ("from the packed rows (now)", "cold")):
            warm_os, dropped = r[key], r[key + "_dropped"]
            print(f"  curves, first read, {what:29s} {warm_os * 1e3:7.0f} ms "
                  f"({warm_os / base:4.2f}x the baseline)" + (
                      "" if dropped is None else f", page cache dropped {dropped * 1e3:6.0f} ms"))
        print(f"    packed rows against step lines: {r['cold'] / r['cold_lines']:.3f}x" + (
            "" if r["cold_dropped"] is None else
            f", {r['cold_dropped'] / r['cold_lines_dropped']:.3f}x with the page cache dropped"))
        print(f"  history write per step {r['add'] * 1e6:7.1f} us, of which the packed key-curve "
              f"row {r['curve_rows'] * 1e6:5.1f} us ({r['curve_rows'] / r['add']:.3f}x)")
        print(f"  packing the rows of the stored steps on the first open after an upgrade "
              f"{r['backfill'] * 1e3:7.0f} ms (once)")
        print(f"  GET /api/curves once warmed (the service  {r['warm'] * 1e3:9.1f} ms  "
              f"{r['warm'] / base:5.3f}x")
        print("    keeps the active runs' columns cached)")
        print(f"  GET /api/runs (the page's poll)           {r['runs'] * 1e3:9.1f} ms")
        print(f"  JSON downloaded: {r['bytes'] / 1e3:,.0f} kB ({int(r['points']):,} points per "
              f"panel at most) against {r['full_bytes'] / 1e6:,.1f} MB for every point "
              f"({r['bytes'] / r['full_bytes']:.3f}x)")
        if "page_warm" in r:
            print(f"  browser, navigation to every panel drawn: right after the service started "
                  f"{r['page_start'] * 1e3:6.0f} ms ({r['page_start'] / base:4.2f}x the "
                  f"baseline)" + (f", page cache dropped {r['page_start_dropped'] * 1e3:6.0f} ms"
                                  if "page_start_dropped" in r else "")
                  + f"; warmed {r['page_warm'] * 1e3:6.0f} ms ({r['page_warm'] / base:5.3f}x)")
            print(f"    with a metric outside the key curves picked: its first time "
                  f"{r['page_picked_first'] * 1e3:6.0f} ms, then {r['page_picked'] * 1e3:6.0f} ms"
                  f" ({r['page_picked'] / r['page_warm']:.2f}x the key panels alone)")
            print(f"    with a second {n:,}-step run overlaid (its columns cached) "
                  f"{r['page_overlay'] * 1e3:6.0f} ms ({r['page_overlay'] / r['page_warm']:.2f}x)")
        print(f"  GET /api/metrics (the picker's names): first read {r['names_first'] * 1e3:.0f} "
              f"ms (the warmer reads it ahead), then {r['names'] * 1e3:.1f} ms")
    last = results[max(results)]
    if "page_warm" in last:
        print(f"budget: a {max(results):,}-step run loads in about 1 s: "
              f"{last['page_warm']:.2f} s warmed ({last['page_warm'] / 1.0:.2f}x the budget), "
              f"{last['page_start']:.2f} s in the first seconds after a start" + (
                  f" ({last['page_start_dropped']:.2f} s with the page cache dropped)"
                  if "page_start_dropped" in last else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
