"""``rlmon replay FILE``: steps and alerts of a recorded run.

Its output lines follow docs/design.md, "The replay contract".

With ``--rules FILE`` it also backtests that rule file: per rule, the steps it would have fired
and resolved (on stderr as ``{"type": "backtest", ...}`` lines with ``--json``, so stdout stays
the contract).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from typing import IO, TYPE_CHECKING

from rich.markup import escape

from rlmon.commands.support.rule_files import read_rules
from rlmon.service.alerting.backtest import RuleBacktest, backtest
from rlmon.service.contract.records import MAX_LINE_BYTES
from rlmon.service.input_files import InputFileError, LineTooLong, bounded_lines, open_regular
from rlmon.service.metrics import catalog
from rlmon.service.replay import ReplayResult, replay

if TYPE_CHECKING:
    from rlmon.service.alerting.alert_types import AlertEvent

__all__ = ["print_backtest", "print_json", "print_table", "register", "run_replay"]

# The columns of the readable table; everything else is in --json.
KEY_METRICS = (
    catalog.IS_RATIO, catalog.LOGP_DIFF, catalog.LOSS, catalog.ENTROPY, catalog.KL,
    catalog.REWARD, catalog.RESPONSE_LENGTH, catalog.CRITIC_LOSS,
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("replay", help="aggregate a JSON Lines partial-report file; print steps/alerts")
    p.add_argument("file", help="JSON Lines file of partial reports ('-' for stdin)")
    p.add_argument("--rules", help="YAML rule file (on top of the default pack); also prints, "
                   "per rule, the steps it would have fired and resolved (a backtest)")
    p.add_argument("--json", action="store_true", help="one JSON object per line (the contract)")
    p.add_argument("--alerts-to", metavar="DEST",
                   help="also deliver the alerts: console, slack, pagerduty, webhook (comma list)")
    p.add_argument("--config", help="rlmon config file (notifiers, routing) for --alerts-to")
    p.add_argument("--all-severities", action="store_true",
                   help="with --alerts-to: send every alert there, ignoring severity routes")
    p.set_defaults(func=run_replay)


def _lines(path: str) -> Iterator[bytes | LineTooLong]:
    """The file's lines, read in chunks: a line over the contract's limit is never held whole
    (it is counted and rejected); a FIFO, a device or a symlink to one is refused unopened."""
    if path == "-":
        yield from bounded_lines(sys.stdin.buffer, MAX_LINE_BYTES)
        return
    with open_regular(path) as handle:
        yield from bounded_lines(handle, MAX_LINE_BYTES)


def _dump(obj: object, out: IO[str]) -> None:
    out.write(json.dumps(obj, allow_nan=False) + "\n")


def print_json(result: ReplayResult, out: IO[str], err: IO[str],
               tested: list[RuleBacktest] | None = None) -> None:
    for error in result.errors:
        _dump(error.to_json(), err)
    for record, events in result.steps:
        _dump(record.to_json(), out)
        for event in events:
            _dump(event.to_json(), out)
    for entry in tested or ():
        _dump(entry.to_json(), err)
    _dump(result.summary(), err)


def _episodes(entry: RuleBacktest) -> str:
    return ", ".join(f"{e.fired}-{e.resolved}" if e.resolved is not None else f"{e.fired}-(firing)"
                     for e in entry.episodes)


def print_backtest(tested: list[RuleBacktest], out: IO[str] | None = None) -> None:
    """Per rule, when it would have fired (fired-resolved step ranges), and the silent rules."""
    from rich.console import Console
    from rich.table import Table

    console = Console(file=out, width=None if (out or sys.stdout).isatty() else 140)
    table = Table(title="rule backtest: steps fired-resolved")
    for col in ("rule", "severity", "run/role", "episodes", "fired at"):
        table.add_column(col)
    for entry in tested:
        if entry.run is None:
            continue
        table.add_row(escape(entry.rule), entry.severity, escape(f"{entry.run}/{entry.role}"),
                      str(len(entry.episodes)), _episodes(entry))
    console.print(table)
    silent = [entry.rule for entry in tested if entry.run is None]
    if silent:
        console.print("never fired: " + ", ".join(silent), highlight=False, markup=False)


def print_table(result: ReplayResult) -> None:
    from rich.console import Console
    from rich.table import Table

    # here, not at the top: the notify package loads the service's config (pydantic-settings),
    # half a second every other command (`rlmon diagnose`) would pay for at start-up
    from rlmon.service.alerting.notify.render import transition_label
    from rlmon.service.wording import counted, format_value

    def said(e: AlertEvent) -> str:
        return transition_label(e.state, e.ended_with_run, e.handed_to,
                                e.severity if e.escalated_from else "")

    console = Console(width=None if sys.stdout.isatty() else 140)
    errors = Console(stderr=True, width=None if sys.stderr.isatty() else 140)
    for error in result.errors:  # rejected lines go to stderr in either mode
        errors.print(f"[red]line {error.line}[/red]: {escape(error.error)}", highlight=False)
    present = {n for record, _ in result.steps for n in record.metrics}
    shown = [n for n in KEY_METRICS if n in present][:6]
    table = Table(title="rlmon replay", show_lines=False)
    for col in ("run", "role", "step", "ranks", *shown, "alerts"):
        table.add_column(col, justify="right" if col not in ("run", "role", "alerts") else "left")
    for record, events in result.steps:
        ranks = f"{record.ranks_reporting}/{record.ranks_expected}"
        if not record.complete:
            ranks = f"[red]{ranks}[/red]"
        cells = [f"{record.metrics[n]:.4g}" if n in record.metrics else "" for n in shown]
        alerts = ", ".join(
            f"[{'red' if e.severity == 'critical' else 'yellow'}]{escape(e.alert)} {said(e)}[/]"
            for e in events
        )
        # names come from the input: text, never markup (a run "[/oops]", a [link=...] tag)
        table.add_row(escape(record.run), escape(record.role), str(record.step), ranks, *cells,
                      alerts)
    console.print(table)
    for _, events in result.steps:
        for e in events:
            colour = "red" if e.severity == "critical" else "yellow"
            # a resolved step may not hold the metric at all: n/a, not a made-up NaN
            console.print(
                f"[{colour}]{escape(e.alert)} {said(e)}[/] "
                + escape(f"{e.run}/{e.role} step {e.step}: "
                         f"{e.metric} = {format_value(e.value)} ({e.condition})"),
                highlight=False,
            )
    c = result.counters
    # a step line is one role's step: 30 steps of 3 roles are 90 of them, not 90 steps
    console.print(
        f"{counted(result.lines, 'line')}, {c.accepted} accepted, {len(result.errors)} "
        f"rejected, {counted(c.duplicates, 'duplicate')}, {c.late} late; "
        f"{counted(len(result.steps), 'step line')} (one per run, role and step; "
        f"{c.steps_incomplete} incomplete), {counted(len(result.alerts), 'alert event')}",
        highlight=False,
    )


def run_replay(args: argparse.Namespace) -> int:
    rules = read_rules(args.rules, "replay")
    if rules is None:
        return 2
    try:
        result = replay(_lines(args.file), rules)
    except InputFileError as exc:
        print(f"rlmon replay: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"rlmon replay: cannot read {args.file}: {exc}", file=sys.stderr)
        return 2
    tested = backtest(rules, result.steps) if args.rules else None
    if args.json:
        print_json(result, sys.stdout, sys.stderr, tested)
    else:
        print_table(result)
        if tested is not None:
            print_backtest(tested)
    if args.alerts_to:
        from rlmon.commands.deliver import deliver_alerts, parse_destinations

        try:
            destinations = parse_destinations(args.alerts_to)
        except ValueError as exc:
            print(f"rlmon replay: {exc}", file=sys.stderr)
            return 2
        delivered = deliver_alerts(result, destinations, args.config, args.all_severities)
        if delivered:
            return delivered
    return result.exit_code
