"""``rlmon alerts``: the alerts firing now, the recent transitions and the runs asked to stop,
from the service's history store (a table for people, ``--json`` for scripts and agents)."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from typing import Any

from rlmon.commands.support.history_store import add_store_arguments, history_path, missing_run

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("alerts", help="list the firing and recent alerts of the history store")
    p.add_argument("--run", default=None, help="only this run")
    p.add_argument("--firing", action="store_true", help="only the alerts firing now")
    p.add_argument("--limit", type=int, default=20,
                   help="how many recent transitions (firing and resolved) to list (default 20)")
    p.add_argument("--json", action="store_true",
                   help='one JSON object: {"firing": [...], "recent": [...], "stops": [...], '
                        '"liveness": [...]}')
    add_store_arguments(p)
    p.set_defaults(func=run_alerts)


def run_alerts(args: argparse.Namespace) -> int:
    from rlmon.service.storage.history import HistoryStore

    db = history_path(args, "alerts")
    if db is None:
        return 2
    if args.run is not None and missing_run(db, args.run, "alerts"):
        return 1
    store = HistoryStore(db)
    try:
        found: dict[str, list[dict[str, Any]]] = {"firing": store.firing_alerts(args.run)}
        if not args.firing:
            found["recent"] = store.recent_alerts(args.run, max(args.limit, 0))
        found["stops"] = [d.to_json() for d in store.stops(args.run)]
        # runs not simply running, by time (docs/liveness.md): slow, stalled, frozen, dead,
        # failed, preempted
        states = store.liveness(args.run)
        found["liveness"] = [row for row in states if row["state"] in (
            "slow", "stalled", "frozen", "dead", "failed", "preempted")]
        if not args.firing:  # runs that ended well, and how (latest first): said, not paged
            finished = sorted((row for row in states if row["state"] == "finished"),
                              key=lambda row: -(row["since"] or 0.0))
            found["finished"] = finished[:max(args.limit, 0)]
    finally:
        store.close()
    if args.json:
        print(json.dumps(found, allow_nan=False))
    else:
        _print_tables(found)
    return 0


def _when(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _print_tables(found: dict[str, list[dict[str, Any]]]) -> None:
    from rich.console import Console
    from rich.table import Table

    from rlmon.service.alerting.notify.render import transition_label
    from rlmon.service.metrics.nonfinite import nonfinite_value
    from rlmon.service.wording import format_value

    console = Console(width=None if sys.stdout.isatty() else 200)
    titles = {"firing": "firing now", "recent": "recent transitions, newest first"}
    for key, title in titles.items():
        if key not in found:
            continue
        rows = found[key]
        if not rows:
            console.print(f"no {'alert firing' if key == 'firing' else 'alert transitions'}")
            continue
        table = Table(title=title)
        for col in ("state", "alert", "severity", "run", "role", "step", "metric", "value",
                    "time (UTC)"):
            table.add_column(col)
        for a in rows:
            state = transition_label(a["state"], bool(a.get("ended_with_run")),
                                     a.get("handed_to") or "")
            table.add_row(state, a["alert"], a["severity"] or "-", a["run"], a["role"],
                          str(a["step"]), a["metric"] or "-",
                          format_value(nonfinite_value(a["value"], a.get("nonfinite"))),
                          _when(a["time"]))
        console.print(table)
    if found.get("liveness"):
        table = Table(title="runs not making progress or ended badly (liveness)")
        for col in ("state", "run", "role", "since (UTC)", "last step", "where"):
            table.add_column(col)
        for row in found["liveness"]:
            last = "-" if row["last_step"] is None else f"{row['last_step']} at " \
                f"{_when(row['last_step_at'])}"
            table.add_row(row["state"], row["run"], row["role"], _when(row["since"]), last,
                          row["detail"])
        console.print(table)
    if found.get("finished"):
        table = Table(title="runs that finished, latest first")
        for col in ("run", "role", "since (UTC)", "how it ended"):
            table.add_column(col)
        for row in found["finished"]:
            table.add_row(row["run"], row["role"], _when(row["since"]), row["detail"])
        console.print(table)
    if found["stops"]:
        table = Table(title="runs asked to stop")
        for col in ("run", "alert", "role", "step", "allowed by", "time (UTC)", "why"):
            table.add_column(col)
        for d in found["stops"]:
            table.add_row(d["run"], d["alert"], d["role"], str(d["step"]), d["allowed_by"],
                          _when(d["at"]), d["reason"])
        console.print(table)
