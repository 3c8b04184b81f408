"""Where things are in the repository, for tests that read its files or run its scripts."""

from __future__ import annotations

from pathlib import Path

__all__ = ["DATA", "REPO", "SUPPORT"]

SUPPORT = Path(__file__).resolve().parent
REPO = SUPPORT.parents[1]
DATA = REPO / "tests" / "data"
