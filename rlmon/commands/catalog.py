"""``rlmon catalog``: the canonical metrics as a table, markdown or JSON."""

from __future__ import annotations

import argparse
import json
import sys

from rlmon.service.metrics.catalog_doc import catalog_json, catalog_markdown
from rlmon.service.metrics.keymaps import FRAMEWORKS, keymap_json, keymap_markdown

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("catalog", help="print the metric catalog")
    p.add_argument("--format", choices=("table", "markdown", "json"), default="table")
    p.add_argument("--framework", choices=FRAMEWORKS, default=None,
                   help="print that framework's key map instead (keys, reduction, fidelity)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    if args.framework is not None:
        return _run_framework(args.framework, args.format)
    if args.format == "markdown":
        print(catalog_markdown(), end="")
    elif args.format == "json":
        print(json.dumps(catalog_json(), indent=2))
    else:
        from rich.console import Console
        from rich.table import Table

        table = Table(title="rlmon metric catalog")
        for col in ("name", "form", "unit", "domain", "healthy", "prometheus", "alerts"):
            table.add_column(col)
        for row in catalog_json():
            table.add_row(
                row["name"], " | ".join(row["forms"]), row["unit"], row["domain"],
                "" if row["healthy"] is None else f"{row['healthy'][0]:g} .. {row['healthy'][1]:g}",
                row["prometheus"], ", ".join(a["name"] for a in row["alerts"]),
            )
        Console(width=None if sys.stdout.isatty() else 200).print(table)
    return 0


def _run_framework(framework: str, fmt: str) -> int:
    rows = keymap_json(framework)
    if fmt == "json":
        print(json.dumps(rows, indent=2))
    elif fmt == "markdown":
        print(keymap_markdown(framework), end="")
    else:
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"rlmon key map: {framework}")
        for col in ("key", "canonical", "framework reduction", "rlmon", "via", "comparable"):
            table.add_column(col)
        for row in rows:
            table.add_row(row["key"], row["canonical"] or "-", row["framework_reduction"],
                          row["rlmon"], row["via"], "yes" if row["comparable_across_runs"] else "no")
        Console(width=None if sys.stdout.isatty() else 200).print(table)
    return 0
