"""rlmon watching itself: ingest, late and dropped partials, notification outcomes, outbox depth,
and the exporter's scrape cost and cardinality budget.

These series carry no run label (one rlmon service serves many runs), so this dashboard adds an
``instance`` variable beside the shared ones.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.models import dashboard as dm

from rlmon.service.dashboards.common import frame
from rlmon.service.dashboards.panels import DATASOURCE, query, stat_panel, timeseries_panel
from rlmon.service.dashboards.promql import select
from rlmon.service.dashboards.thresholds import Band
from rlmon.service.export import series

__all__ = ["SCRAPE_BUDGET_SECONDS", "UID", "build"]

UID = "rlmon-self"
INSTANCE = 'instance=~"$instance"'
# the budget (docs/design.md, "Budgets"): a scrape of 10,000 series in < 100 ms
SCRAPE_BUDGET_SECONDS = 0.1
_ZERO_OK = [Band(None, "green"), Band(1, "red")]


def _rate(metric: str, by: str = "instance") -> str:
    return f"sum by ({by}) (rate({select(metric, INSTANCE)}[$__rate_interval]))"


def _increase(metric: str, extra: str = "") -> str:
    matchers = INSTANCE + (", " + extra if extra else "")
    return f"sum(increase({select(metric, matchers)}[$__range])) or vector(0)"


def _instance_variable() -> db.QueryVariable:
    return (
        db.QueryVariable("instance").label("rlmon instance").datasource(DATASOURCE)
        .query(f"label_values({series.SERIES.name}, instance)")
        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(dm.VariableSort.ALPHABETICAL_ASC)
        .multi(True).include_all(True).all_value(".*")
    )


def build() -> db.Dashboard:
    dash = frame(UID, "rlmon / Self-monitoring",
                 "Is rlmon itself healthy? Partials in, rejected, late and dropped; "
                 "notifications sent, retried and failed; outbox depth; exporter cost.",
                 [_instance_variable()])
    dash = (
        dash.with_row(db.Row("At a glance"))
        .with_panel(stat_panel("Partials dropped", "Records dropped by a full buffer in the "
                               "selected time range: these never reached a step.",
                               _increase(series.PARTIALS_DROPPED.name), bands=_ZERO_OK,
                               legend="dropped"))
        .with_panel(stat_panel("Notifications failed", "Notifications given up on in the "
                               "selected time range (kept in the outbox's failed table).",
                               _increase(series.NOTIFICATIONS.name, 'outcome="failed"'),
                               bands=_ZERO_OK, legend="failed"))
        .with_panel(stat_panel("Outbox pending", "Notifications waiting for delivery now.",
                               f"sum({select(series.OUTBOX_PENDING.name, INSTANCE)}) or vector(0)",
                               bands=[Band(None, "green"), Band(1, "orange"), Band(100, "red")],
                               legend="pending"))
        .with_panel(stat_panel("Series refused", "Series refused by the cardinality budget in "
                               "the selected time range.", _increase(series.SERIES_REFUSED.name),
                               bands=_ZERO_OK, legend="refused"))
        .with_row(db.Row("Ingest"))
        .with_panel(timeseries_panel(
            "Partials ingested", "Metric partials merged into steps, per second.",
            [query(_rate(series.PARTIALS_INGESTED.name), "{{instance}}")], unit="short", span=12))
        .with_panel(timeseries_panel(
            "Rejected, late and dropped", "Records rejected as invalid, arriving after their "
            "step was finalized, or dropped by a full buffer, per second.",
            [query(_rate(series.PARTIALS_REJECTED.name), "{{instance}} rejected", "A"),
             query(_rate(series.PARTIALS_LATE.name), "{{instance}} late", "B"),
             query(_rate(series.PARTIALS_DROPPED.name), "{{instance}} dropped", "C")],
            unit="short", span=12))
        .with_row(db.Row("Notifications"))
        .with_panel(timeseries_panel(
            "Delivery outcomes", "Notification attempts per destination and outcome "
            "(sent, retried, failed), per second.",
            [query(_rate(series.NOTIFICATIONS.name, "destination, outcome"),
                   "{{destination}} {{outcome}}")], unit="short", span=12))
        .with_panel(timeseries_panel(
            "Outbox depth", "Notifications waiting in the durable outbox, per destination.",
            [query(f"sum by (destination) ({select(series.OUTBOX_PENDING.name, INSTANCE)})",
                   "{{destination}}")], unit="short",
            bands=[Band(None, "green"), Band(100, "orange")], span=12))
        .with_row(db.Row("Exporter"))
        .with_panel(timeseries_panel(
            "Scrape duration", "Time the previous scrape took to build; the budget line is "
            "docs/design.md's 100 ms for 10,000 series.",
            [query(select(series.SCRAPE_SECONDS.name, INSTANCE), "{{instance}}")], unit="s",
            bands=[Band(None, "green"), Band(SCRAPE_BUDGET_SECONDS, "red")], span=8))
        .with_panel(timeseries_panel(
            "Series vs budget", "Series under the cardinality budget, and the budget.",
            [query(select(series.SERIES.name, INSTANCE), "{{instance}} series", "A"),
             query(select(series.SERIES_BUDGET.name, INSTANCE), "{{instance}} budget", "B")],
            unit="short", span=8))
        .with_panel(timeseries_panel(
            "Streams expired, series refused", "(run, role) streams removed after their TTL "
            "and series refused by the budget, per second.",
            [query(_rate(series.STREAMS_EXPIRED.name), "{{instance}} expired", "A"),
             query(_rate(series.SERIES_REFUSED.name), "{{instance}} refused", "B")],
            unit="short", span=8))
        .with_panel(timeseries_panel(
            "Resident memory", "The rlmon service process's resident memory.",
            [query(select(series.PROCESS_RSS.name, INSTANCE), "{{instance}}")], unit="bytes",
            span=12))
    )
    return dash
