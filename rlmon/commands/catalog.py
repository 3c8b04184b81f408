"""``rlmon catalog``: the canonical metrics as a table, markdown or JSON."""

from __future__ import annotations

import argparse
import json

from rlmon.service.catalog_doc import catalog_json, catalog_markdown

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("catalog", help="print the metric catalog")
    p.add_argument("--format", choices=("table", "markdown", "json"), default="table")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
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
        Console().print(table)
    return 0
