"""Generated files that are checked in: the docs' metric tables, dashboards, rule files.

Each producer module exposes ``artifacts() -> list[Artifact]``. ``rlmon generate`` writes them all;
``rlmon generate --check`` (and a test) fails when a checked-in copy is stale.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from rlmon.service.artifact import Artifact
from rlmon.service.metrics.catalog_doc import catalog_markdown

__all__ = ["PRODUCERS", "Artifact", "all_artifacts", "stale", "write"]

# Modules with an `artifacts()` function; the generators of later features add themselves here.
PRODUCERS: tuple[str, ...] = (
    "rlmon.service.generated",
    "rlmon.service.dashboards.artifacts",
    "rlmon.service.export.prometheus_rules",
    "rlmon.service.export.exporter_doc",
    "rlmon.service.metrics.keymaps",
    "rlmon.service.helm_schema",
    "rlmon.service.metrics.remedies",
    "rlmon.service.alerting.rules_doc",
)


def artifacts() -> list[Artifact]:
    return [Artifact("docs/metrics.md", catalog_markdown, block="catalog")]


def all_artifacts() -> list[Artifact]:
    found: list[Artifact] = []
    for name in PRODUCERS:
        found += importlib.import_module(name).artifacts()
    return found


def _read(path: Path) -> str | None:
    return path.read_text(encoding="utf-8") if path.exists() else None


def stale(root: Path) -> list[str]:
    """Paths whose checked-in content differs from what the code renders now."""
    out = []
    for art in all_artifacts():
        current = _read(root / art.path)
        if current != art.expected(current):
            out.append(art.path + (f" (block {art.block})" if art.block else ""))
    return out


def write(root: Path) -> list[str]:
    """Render every artifact under ``root``; returns the paths that changed."""
    changed = []
    for art in all_artifacts():
        path = root / art.path
        current = _read(path)
        new = art.expected(current)
        if new != current:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(new, encoding="utf-8")
            changed.append(art.path)
    return changed
