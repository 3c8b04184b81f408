"""``rlmon demo``: replay the bundled example run (until the Ray demo lands)."""

from __future__ import annotations

import argparse
from importlib import resources

from rlmon.commands.replay import print_json, print_table
from rlmon.service.replay import replay

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("demo", help="run the demo")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    import sys

    data = resources.files("rlmon") / "data" / "example_run.jsonl"
    with data.open("rb") as handle:
        result = replay(handle)
    if args.json:
        print_json(result, sys.stdout, sys.stderr)
    else:
        print_table(result)
    return result.exit_code
