"""The RLHF run overview: health at a glance, then every catalog metric of the overview dashboard.

Rows come from the catalog's panel hints; ``ROWS`` fixes their order top to bottom (what someone
paged at night needs first), and a test fails if the catalog grows a row that is not listed here.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.models import dashboard as dm

from rlmon.service.dashboards.common import frame
from rlmon.service.dashboards.panels import (
    catalog_rows,
    metric_groups,
    metric_panel,
    query,
    stat_panel,
    table_panel,
    timeseries_panel,
)
from rlmon.service.dashboards.promql import RUN_ROLE, select
from rlmon.service.dashboards.thresholds import Band
from rlmon.service.export import series

__all__ = ["ROWS", "UID", "build"]

UID = "rlmon-overview"
DASHBOARD = "overview"
ROWS = (
    "Reward",
    "Rollout",
    "Rollout / trainer mismatch",
    "Optimisation",
    "Performance",
    "Hardware",
    "Critic",
)
_GREEN_RED = [Band(None, "green"), Band(1, "red")]


def health_panels() -> list[Builder[dm.Panel]]:
    """Alerts firing, missing ranks, latest step: the first row of the run dashboards."""
    firing = select(series.ALERT_FIRING.name) + " == 1"
    reporting, expected = select(series.RANKS_REPORTING.name), select(series.RANKS_EXPECTED.name)
    return [
        stat_panel("Firing alerts", "rlmon alerts firing now for the selected runs and roles.",
                   f"count({firing}) or vector(0)", bands=_GREEN_RED, legend="firing"),
        stat_panel("Ranks missing",
                   "Expected ranks that did not report the latest finalized step (a missing "
                   "rank is reported as missing, never as a frozen value).",
                   f"sum(clamp_min({expected} - {reporting}, 0)) or vector(0)",
                   bands=_GREEN_RED, legend="missing"),
        stat_panel("Latest step", "The last finalized trainer step per run and role.",
                   f"max by (run, role) ({select(series.STEP.name)})"),
        stat_panel("Step complete",
                   "1 when the latest step was finalized with every expected rank, 0 when it "
                   "was finalized at its deadline without them.",
                   f"min by (run, role) ({select(series.STEP_COMPLETE.name)})",
                   bands=[Band(None, "red"), Band(1, "green")]),
        timeseries_panel(
            "Ranks reporting vs expected",
            "Ranks whose partials made it into the latest finalized step, against the world "
            "size the ranks declared.",
            [query(reporting, "{{run}} {{role}} reporting", "A"),
             query(expected, "{{run}} {{role}} expected", "B")],
            unit="short", span=12,
        ),
        table_panel("Firing alerts by run and role",
                    "One row per firing alert; the same alerts mark the charts as annotations.",
                    firing, span=12, height=8),
        timeseries_panel(
            "Data quality",
            "Metrics of the latest step that are NaN or Inf, outside their physical domain, or "
            "whose replicated copies disagree (NonFiniteMetric, MetricOutOfDomain, "
            "ReplicaMismatch).",
            [query(select(series.NONFINITE_METRICS.name), "{{run}} {{role}} non-finite", "A"),
             query(select(series.OUT_OF_DOMAIN_METRICS.name), "{{run}} {{role}} out of domain", "B"),
             query(select(series.REPLICA_MISMATCHES.name), "{{run}} {{role}} replica mismatch", "C")],
            unit="short", bands=_GREEN_RED, span=12),
        table_panel("Runs",
                    "What each run declared: framework and version, algorithm, loss reduction, "
                    "parallel layout, gradient accumulation, ZeRO stage.",
                    f'{series.RUN_INFO.name}{{run=~"$run"}}', span=12, height=8),
    ]


def goodput_panels() -> list[Builder[dm.Panel]]:
    """Where the GPU-hours go (docs/goodput.md): the goodput ratio, GPU-seconds per bucket as
    rates of their counters, and why ranks idle or waste."""
    seconds = series.GOODPUT_SECONDS.name
    rate = f"rate({select(seconds)}[5m])"
    productive = select(seconds, RUN_ROLE + ', bucket="productive"')
    return [
        stat_panel("Goodput", "Productive GPU-seconds over all GPU-seconds of the selected "
                   "roles' accounted steps (a step is accounted when the run is two steps "
                   "past it).",
                   f"sum by (run) ({productive}) / sum by (run) ({select(seconds)})",
                   unit="percentunit",
                   bands=[Band(None, "red"), Band(0.3, "orange"), Band(0.6, "green")]),
        stat_panel("MFU", "Model FLOPs utilisation of the run so far (every role), when the "
                   "config gives the model's FLOPs per token and the GPUs' peak.",
                   f'{series.MFU.name}{{run=~"$run"}}', unit="percentunit"),
        timeseries_panel(
            "GPUs by bucket",
            "GPU-seconds per second by bucket: productive, overhead (weight sync, checkpoints, "
            "evaluation, logging), idle (derived from the timelines), wasted (tied groups, "
            "truncation, discarded steps).",
            [query(f"sum by (run, bucket) ({rate})", "{{run}} {{bucket}}")],
            unit="short", span=12),
        timeseries_panel(
            "Idle and wasted by reason",
            "GPU-seconds per second lost, by why: a straggler, waiting for rollouts or "
            "weights, the pipeline, unattributed; tied reward groups, truncated completions, "
            "discarded or rolled-back steps.",
            [query(f'sum by (run, bucket, reason) (rate({seconds}{{run=~"$run", '
                   f'role=~"$role", bucket=~"idle|wasted"}}[5m]))',
                   "{{run}} {{bucket}}/{{reason}}")],
            unit="short", span=24),
    ]


def build() -> db.Dashboard:
    dash = frame(UID, "rlmon / RLHF run overview",
                 "Reward, rollout, rollout/trainer mismatch, optimisation and performance "
                 "metrics of RLHF runs, aggregated exactly across ranks by rlmon.")
    dash = dash.with_row(db.Row("Health"))
    for panel in health_panels():
        dash = dash.with_panel(panel)
    dash = dash.with_row(db.Row("Goodput"))
    for panel in goodput_panels():
        dash = dash.with_panel(panel)
    rows = catalog_rows(DASHBOARD)
    for row in ROWS:
        dash = dash.with_row(db.Row(row))
        for group in metric_groups(rows.get(row, [])):
            dash = dash.with_panel(metric_panel(group))
    return dash
