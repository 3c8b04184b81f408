"""``rlmon report RUN [--json | --html FILE]``: a run's health, cost and goodput in one place,
from the history store, offline (no Ray, no service)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from rlmon.commands.support.history_store import add_store_arguments, history_path, missing_run

if TYPE_CHECKING:
    from rlmon.service.report.model import RunReport

__all__ = ["register", "write_report"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("report", help="a run's steps, alerts and their cost, goodput, slowest "
                       "ranks and stages, worst samples and key curves")
    p.add_argument("run", help="the run id")
    p.add_argument("--json", action="store_true", help="the report as one JSON object")
    p.add_argument("--html", default=None, metavar="FILE",
                   help="write the report as one self-contained HTML file (plots embedded)")
    p.add_argument("--config", default=None,
                   help="YAML settings: goodput.gpus_per_rank, spans, price, MFU inputs")
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


def run_report(args: argparse.Namespace) -> int:
    from rlmon.service.config import ConfigError
    from rlmon.service.report.text import render_text

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
        print(json.dumps(report.to_json(), allow_nan=False))
    else:
        sys.stdout.write(render_text(report))
    if args.html:
        print(f"report written to {args.html}", file=sys.stderr if args.json else sys.stdout)
    return 0
