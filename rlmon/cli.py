"""The ``rlmon`` command. Each subcommand lives in its own module under :mod:`rlmon.commands`."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

__all__ = ["main"]

# Each module defines register(subparsers) and sets a `func(args) -> int` default on its parser.
COMMAND_MODULES: tuple[str, ...] = (
    "rlmon.commands.replay",
    "rlmon.commands.alerts",
    "rlmon.commands.samples",
    "rlmon.commands.catalog",
    "rlmon.commands.rules",
    "rlmon.commands.generate",
    "rlmon.commands.demo",
    "rlmon.commands.dashboards",
    "rlmon.commands.serve",
    "rlmon.commands.trace",
    "rlmon.commands.report",
    "rlmon.commands.diagnose",
    "rlmon.commands.diff",
    "rlmon.commands.export",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rlmon", description="Monitoring for RLHF training on Ray."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except BrokenPipeError:  # `rlmon replay ... | head` is fine
        return 0
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
