"""PromQL used by the dashboards: one way to select a series.

Every panel filters by the dashboard's ``$run`` and ``$role`` variables in the same way, so the
selector is built here once.
"""

from __future__ import annotations

__all__ = ["RUN_ROLE", "select"]

RUN_ROLE = 'run=~"$run", role=~"$role"'


def select(metric: str, matchers: str = RUN_ROLE) -> str:
    """``metric{matchers}``: a series selector filtered by the dashboard variables."""
    return f"{metric}{{{matchers}}}" if matchers else metric
