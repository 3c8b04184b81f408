"""The rollout / vLLM dashboard: generation throughput, engine load and what the rollouts look like.

The catalog's ``rollout`` dashboard metrics (throughput, the vLLM engine's scheduler state) come
first, then the overview's "Rollout" row (lengths, truncation, policy lag) so a rollout engineer
needs one screen.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as db

from rlmon.service.dashboards.common import frame
from rlmon.service.dashboards.panels import (
    catalog_rows,
    metric_groups,
    metric_panel,
    query,
    stat_panel,
    timeseries_panel,
)
from rlmon.service.dashboards.promql import select
from rlmon.service.export import series

__all__ = ["ROWS", "SHARED_ROWS", "UID", "build"]

UID = "rlmon-rollout"
DASHBOARD = "rollout"
ROWS = ("Throughput", "Engine")
SHARED_ROWS = ("Rollout",)  # rows of the overview repeated here


def build() -> db.Dashboard:
    dash = frame(UID, "rlmon / Rollout and vLLM",
                 "Rollout generation: throughput, vLLM engine scheduler state and KV cache, "
                 "response lengths and policy lag.")
    reporting, expected = select(series.RANKS_REPORTING.name), select(series.RANKS_EXPECTED.name)
    dash = (
        dash.with_row(db.Row("Progress"))
        .with_panel(stat_panel("Latest step", "The last finalized step per run and role.",
                               f"max by (run, role) ({select(series.STEP.name)})", span=8, height=8))
        .with_panel(timeseries_panel(
            "Engines reporting vs expected",
            "Rollout ranks (engines) that reported the latest finalized step.",
            [query(reporting, "{{run}} {{role}} reporting", "A"),
             query(expected, "{{run}} {{role}} expected", "B")],
            unit="short", span=16))
    )
    rows = catalog_rows(DASHBOARD)
    shared = catalog_rows("overview")
    for row in ROWS + SHARED_ROWS:
        dash = dash.with_row(db.Row(row))
        for group in metric_groups(rows.get(row) or shared.get(row, [])):
            dash = dash.with_panel(metric_panel(group))
    return dash
