"""``rlmon samples RUN [--role R] [--step N | --alert NAME] [--json]``: the worst samples a run's
steps kept, from the history store (no Ray)."""

from __future__ import annotations

import argparse
import json
import sys

from rlmon.commands.support.history_store import add_store_arguments, history_path, missing_run
from rlmon.service.wording import counted

__all__ = ["register"]

_PAYLOAD_COLUMN = 72  # characters of payload in the table (--json prints it whole)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("samples", help="print the worst samples of a run's steps")
    p.add_argument("run", help="the run id")
    p.add_argument("--role", default=None, help="only this role (default: every role)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--step", type=int, default=None,
                       help="this step (default: each role's latest step with samples)")
    which.add_argument("--alert", default=None, metavar="NAME",
                       help="the step where alert NAME last fired, and its metric's samples")
    p.add_argument("--metric", default=None, help="only this sample metric")
    p.add_argument("--json", action="store_true", help="one JSON object per (step, metric)")
    add_store_arguments(p)
    p.set_defaults(func=run_samples)


def _one_line(text: str, width: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[:width - 1] + "…"


def run_samples(args: argparse.Namespace) -> int:
    from rlmon.service.metrics import catalog
    from rlmon.service.storage.history import HistoryStore
    from rlmon.service.wording import format_value

    db = history_path(args, "samples")
    if db is None:
        return 2
    if missing_run(db, args.run, "samples"):
        return 1
    store = HistoryStore(db)
    try:
        step, metric, role = args.step, args.metric, args.role
        heading = ""
        if args.alert is not None:
            firings = [a for a in store.alerts(args.run) if a["state"] == "firing"]
            fired = [a for a in firings
                     if a["alert"] == args.alert and (role is None or a["role"] == role)]
            if not fired:
                named = sorted({a["alert"] for a in firings})
                print(f"rlmon samples: alert {args.alert!r} never fired in run {args.run!r}"
                      + (f" role {role!r}" if role else "")
                      + (f" (alerts that fired there: {', '.join(named)})" if named else
                         " (no alert fired there)"), file=sys.stderr)
                return 1
            last = fired[-1]
            step, role = int(last["step"]), str(last["role"])
            metric = metric or catalog.samples_for(str(last["metric"]))
            if metric is None:
                print(f"rlmon samples: {last['metric']} (the metric of {args.alert}) has no "
                      "sample metric in the catalog; showing every sample metric of its step",
                      file=sys.stderr)
            heading = (f"{args.alert} fired at {args.run}/{role} step {step}: {last['metric']} "
                       f"= {format_value(last['value'])}")
        found = store.samples(args.run, role, step, metric)
    finally:
        store.close()
    if not found:
        where = f" step {step}" if step is not None else ""
        print(f"rlmon samples: no samples of run {args.run!r}"
              + (f" role {role!r}" if role else "") + where
              + (f" metric {metric!r}" if metric else ""), file=sys.stderr)
        return 1
    if args.json:
        for entry in found:
            print(json.dumps(entry.to_json(), allow_nan=False))
        return 0
    if heading:
        print(heading)
    for entry in found:
        cut = f" ({counted(entry.cut, 'payload')} cut to the store's budget)" if entry.cut else ""
        print(f"{entry.run}/{entry.role} step {entry.step}: {entry.metric}{cut}")
        width = max([len(i) for _, i, _ in entry.items] + [2])
        print(f"  {'#':>2}  {'score':>10}  {'id':<{width}}  payload")
        for n, (score, ident, payload) in enumerate(entry.items, 1):
            print(f"  {n:>2}  {format_value(score):>10}  {ident:<{width}}  "
                  f"{_one_line(payload, _PAYLOAD_COLUMN)}")
    return 0
