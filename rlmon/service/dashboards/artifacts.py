"""Checked-in files rendered from the dashboards: ``dashboards/*.json`` and the Helm chart's copies.

Helm can only read files inside the chart, so the chart carries copies of the dashboards and of
the Prometheus rule files (``groups:`` at the top) other producers write under ``dashboards/``;
the chart wraps those groups in its own PrometheusRule, with its labels and namespace. Each copy
is an Artifact rendered by the same function as its original, so ``rlmon generate --check`` fails
when either drifts.
"""

from __future__ import annotations

from functools import partial

import yaml

from rlmon.service.artifact import Artifact
from rlmon.service.dashboards.registry import DASHBOARDS, DIRECTORY, render
from rlmon.service.export import prometheus_rules

__all__ = ["CHART_FILES", "artifacts", "chart_copies", "chart_path"]

CHART_FILES = "helm/rlmon/files"
_RULE_SUFFIXES = (".yaml", ".yml")


def dashboard_artifacts() -> list[Artifact]:
    return [Artifact(d.path, partial(render, d)) for d in DASHBOARDS]


def _is_rule_file(text: str) -> bool:
    """A Prometheus rule file (top-level ``groups``), not a PrometheusRule object wrapping one."""
    data = yaml.safe_load(text)
    return isinstance(data, dict) and isinstance(data.get("groups"), list)


# the producers of Prometheus rule files under dashboards/ (imported, not looked up by name in
# rlmon.service.generated's list, which imports this module)
_RULE_PRODUCERS = (prometheus_rules.artifacts,)


def _rule_artifacts() -> list[Artifact]:
    """Prometheus rule files that other producers generate under ``dashboards/``."""
    found = []
    for produce in _RULE_PRODUCERS:
        for art in produce():
            if (art.block is None and art.path.startswith(DIRECTORY + "/")
                    and art.path.endswith(_RULE_SUFFIXES) and _is_rule_file(art.render())):
                found.append(art)
    return found


def chart_path(original: str) -> str:
    """``dashboards/x.json`` -> ``helm/rlmon/files/dashboards/x.json``; rule files -> ``files/rules/``."""
    name = original.removeprefix(DIRECTORY + "/")
    kind = "rules" if name.endswith(_RULE_SUFFIXES) else "dashboards"
    return f"{CHART_FILES}/{kind}/{name}"


def chart_copies(originals: list[Artifact]) -> list[Artifact]:
    """The same renderers, writing into the chart."""
    return [Artifact(chart_path(art.path), art.render) for art in originals]


def artifacts() -> list[Artifact]:
    own = dashboard_artifacts()
    return own + chart_copies(own + _rule_artifacts())
