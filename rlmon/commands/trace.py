"""``rlmon trace RUN -o FILE``: a run's step timelines as a Perfetto trace (ui.perfetto.dev)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from rlmon.commands.support.history_store import add_store_arguments, history_path, missing_run
from rlmon.service.wording import counted

__all__ = ["OPEN_HINT", "parse_steps", "register", "write_trace"]


def parse_steps(text: str) -> tuple[int, int | None]:
    """``A:B`` (both included), ``A:`` (from A on), ``:B`` or ``N`` (one step)."""
    first, sep, last = text.partition(":")
    try:
        if not sep:
            return int(first), int(first)
        return (int(first) if first else 0), (int(last) if last else None)
    except ValueError:
        raise argparse.ArgumentTypeError(f"steps: give A:B, A:, :B or N, got {text!r}") from None


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("trace", help="write a run's step timelines as a Perfetto trace")
    p.add_argument("run", help="the run id")
    p.add_argument("--role", default=None, help="only this role (default: every role)")
    p.add_argument("--steps", type=parse_steps, default=(0, None), metavar="A:B",
                   help="the steps to draw, A to B included (A:, :B and N work too)")
    add_store_arguments(p)
    p.add_argument("-o", "--output", required=True, help="the trace file to write (.pftrace)")
    p.set_defaults(func=run_trace)


def run_trace(args: argparse.Namespace) -> int:
    db = history_path(args, "trace")
    if db is None:
        return 2
    if missing_run(db, args.run, "trace"):
        return 1
    first, last = args.steps
    written = write_trace(db, args.run, args.output, args.role, first, last)
    if written is None:
        print(f"rlmon trace: no timelines of run {args.run!r}"
              + (f" role {args.role!r}" if args.role else "")
              + f" in steps {first}:{'' if last is None else last}", file=sys.stderr)
        return 1
    print(f"wrote {args.output}: {written}; {OPEN_HINT}")
    return 0


OPEN_HINT = "open it at https://ui.perfetto.dev (Open trace file, or drop the file on the page)"


def write_trace(db: Path, run: str, output: str | Path, role: str | None = None,
                first: int = 0, last: int | None = None) -> str | None:
    """Write the trace of ``run`` from the history store ``db``; what it holds, in words, or
    None when the store has no timelines for it."""
    from rlmon.service.export.perfetto import TraceInput, build_trace
    from rlmon.service.storage.history import HistoryStore

    store = HistoryStore(db)
    try:
        timelines = store.timelines(run, role, first, last)
        if not timelines:
            return None
        data = TraceInput(timelines, store.alerts(run), store.steps(run, role))
    finally:
        store.close()
    trace = build_trace(data)
    tmp = f"{output}.tmp"
    Path(tmp).write_bytes(trace)
    os.replace(tmp, output)
    ranks = {(t.role, r.rank) for t in timelines for r in t.ranks}
    roles = {t.role for t in timelines}
    # one timeline per role and step: 30 steps of 3 roles are 30 steps, not 90
    steps = counted(len({t.step for t in timelines}), "step") \
        + (f" of {counted(len(roles), 'role')}" if len(roles) > 1 else "")
    return f"{steps}, {counted(len(ranks), 'rank')}, {len(trace)} bytes"
