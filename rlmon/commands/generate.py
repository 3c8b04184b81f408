"""``rlmon generate [--check]``: render the checked-in generated files from the catalog."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rlmon.service import generated

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("generate", help="write (or --check) the generated docs tables, dashboards, rules")
    p.add_argument("--root", default=".", help="project root (default: current directory)")
    p.add_argument("--check", action="store_true", help="exit 1 when a generated file is stale")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    root = Path(args.root)
    if args.check:
        paths = generated.stale(root)
        for path in paths:
            print(f"stale: {path} (run `rlmon generate`)", file=sys.stderr)
        return 1 if paths else 0
    for path in generated.write(root):
        print(f"wrote {path}")
    return 0
