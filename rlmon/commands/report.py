"""``rlmon report RUN [--json | --html FILE]``: a run's health, cost and goodput in one place,
from the history store, offline (no Ray, no service).

``RUN`` may also be a foreign log (a path ``rlmon diagnose`` reads: TensorBoard, W&B, a
``trainer_state.json`` ...): its report is built from the diagnosed steps and alerts, with the
step times, GPU-hours and projections the files allow (``--gpus``, ``--price-per-gpu-hour``)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from rlmon.commands.support.arguments import gpu_count, gpu_price
from rlmon.commands.support.history_store import add_store_arguments, history_path, missing_run
from rlmon.service.json_output import dumps
from rlmon.service.terminal_text import visible_output

if TYPE_CHECKING:
    from rlmon.service.report.model import RunReport

__all__ = ["register", "write_report"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("report", help="a run's steps, alerts and their cost, goodput, slowest "
                       "ranks and stages, worst samples and key curves")
    p.add_argument("run", help="the run id, or the path of a foreign log (as rlmon diagnose)")
    p.add_argument("--json", action="store_true", help="the report as one JSON object")
    p.add_argument("--html", default=None, metavar="FILE",
                   help="write the report as one self-contained HTML file (plots embedded)")
    p.add_argument("--config", default=None,
                   help="YAML settings: goodput.gpus_per_rank, spans, price, MFU inputs")
    p.add_argument("--gpus", type=gpu_count, default=None, metavar="N",
                   help="a foreign log's GPUs, for GPU-hours (default: the world size its "
                   "settings record)")
    p.add_argument("--price-per-gpu-hour", type=gpu_price, default=None, metavar="PRICE",
                   help="a foreign log's price per GPU-hour")
    add_store_arguments(p)
    p.set_defaults(func=run_report)


def write_report(db: Path, run: str, html_path: str | Path | None = None,
                 config: str | Path | None = None) -> RunReport:
    """Build ``run``'s report from the history store ``db``; write it as HTML when asked.
    Returns the :class:`~rlmon.service.report.model.RunReport`."""
    from rlmon.service.config import load_config
    from rlmon.service.report.html import render_html
    from rlmon.service.report.model import build_report
    from rlmon.service.storage.history import HistoryStore

    settings = load_config(config, only=("goodput",))
    store = HistoryStore(db)
    try:
        report = build_report(store, run, settings.goodput)
    finally:
        store.close()
    if html_path is not None:
        tmp = f"{html_path}.tmp"
        Path(tmp).write_text(render_html(report), encoding="utf-8")
        os.replace(tmp, html_path)
    return report


def _foreign_report(args: argparse.Namespace) -> int:
    """A log's report: each run it holds diagnosed (as rlmon diagnose), then reported."""
    from rlmon.commands.diagnose import diagnose_each
    from rlmon.service.diagnose.formats import read_paths
    from rlmon.service.diagnose.html import render_html, run_report
    from rlmon.service.report.text import render_text

    runs, problems = read_paths([args.run])
    problems.extend(p for run in runs for p in run.problems)
    diagnoses = diagnose_each(runs, problems, gpus=args.gpus, price=args.price_per_gpu_hour)
    for problem in problems:
        print(f"rlmon report: cannot read {problem.path}: {problem.message}", file=sys.stderr)
    for d in diagnoses:
        report = run_report(d)
        if args.json:
            print(dumps({**report.to_json(), "source": d.run.source,
                              "cost": d.clock.to_json() if d.clock is not None else None,
                              "findings_cost": [
                                  {"alert": f.alert, "step": f.step, **f.cost.to_json()}
                                  for f in d.findings if f.cost is not None],
                              "projections": [p.to_json(d.seconds_per_step)
                                              for p in d.projections]}))
            continue
        sys.stdout.write(render_text(report))
        print(f"from {d.run.source} ({d.run.format})")
        if d.clock is not None:  # else why not is in the report's notes
            print(d.clock.describe())
        for p in d.projections:
            print(f"heading: {p.describe(d.seconds_per_step)}")
    if args.html and diagnoses:
        tmp = f"{args.html}.tmp"
        Path(tmp).write_text(render_html(diagnoses, problems), encoding="utf-8")
        os.replace(tmp, args.html)
        print(f"report written to {args.html}", file=sys.stderr if args.json else sys.stdout)
    return 2 if problems or not diagnoses else 0


def run_report(args: argparse.Namespace) -> int:
    with visible_output():  # names from the files are shown, never obeyed by the terminal
        return _run_report(args)


def _run_report(args: argparse.Namespace) -> int:
    from rlmon.service.config import ConfigError
    from rlmon.service.report.text import render_text

    if Path(args.run).exists():  # a path: a foreign log, not a run of the history store
        return _foreign_report(args)
    db = history_path(args, "report")
    if db is None:
        return 2
    if missing_run(db, args.run, "report"):
        return 1
    try:
        report = write_report(db, args.run, args.html, args.config)
    except ConfigError as exc:
        print(f"rlmon report: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(dumps(report.to_json()))
    else:
        sys.stdout.write(render_text(report))
    if args.html:
        print(f"report written to {args.html}", file=sys.stderr if args.json else sys.stdout)
    return 0
