"""``rlmon export RUN [--role ROLE] --format parquet|csv -o PATH``: a run's steps out of the
history store, one row per (role, attempt, step) and one column per metric, plus the step's time
and completeness (no Ray; streamed a page at a time, so a long run needs little memory)."""

from __future__ import annotations

import argparse
import sys

from rlmon.commands.support.history_store import add_store_arguments, history_path, missing_run

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("export", help="write a run's steps to Parquet or CSV")
    p.add_argument("run", help="the run id")
    p.add_argument("--role", default=None, help="only this role (default: every role)")
    p.add_argument("--format", choices=("parquet", "csv"), default=None,
                   help="the file's format (default: from the -o suffix, .parquet or .csv)")
    p.add_argument("-o", "--output", required=True, metavar="PATH", help="the file to write")
    add_store_arguments(p)
    p.set_defaults(func=run_export)


def run_export(args: argparse.Namespace) -> int:
    from rlmon.service.storage.step_files import write_csv, write_parquet
    from rlmon.service.storage.step_table import StepTable
    from rlmon.service.wording import counted

    fmt = args.format
    if fmt is None:
        suffix = args.output.rsplit(".", 1)[-1].lower()
        if suffix not in ("parquet", "csv"):
            print(f"rlmon export: say --format parquet or csv (-o {args.output} has neither "
                  "suffix)", file=sys.stderr)
            return 2
        fmt = suffix
    db = history_path(args, "export")
    if db is None:
        return 2
    if missing_run(db, args.run, "export"):
        return 1
    table = StepTable(db, args.run, args.role)
    if args.role is not None and not table.steps():
        print(f"rlmon export: run {args.run!r} has no role {args.role!r}", file=sys.stderr)
        return 1
    try:
        rows = (write_parquet if fmt == "parquet" else write_csv)(table, args.output)
    except ImportError as exc:
        print(f"rlmon export: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"rlmon export: cannot write {args.output}: {exc.strerror}", file=sys.stderr)
        return 2
    # a row is one role's step: a run of 30 steps and 3 roles is 90 rows, not 90 steps
    print(f"rlmon export: {counted(rows, 'row')} (a row per role and step) x "
          f"{counted(len(table.metrics()), 'metric')} of run {args.run} to {args.output} ({fmt})",
          file=sys.stderr)
    return 0
