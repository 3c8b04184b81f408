"""Names of the exporter's own series (step, ranks, alerts, self-metrics) as the dashboards use them.

The catalog names the metric families and :mod:`rlmon.service.exporter` names the rest; this
module takes them from there. The exporter builds its self-metric names inline, so those are
spelled here; a test checks them against ``exported_metric_names()`` and a live ``/metrics``, so a
rename in the exporter fails the suite instead of leaving an empty panel.
"""

from __future__ import annotations

from rlmon.service.exporter import (
    ALERT_FIRING,
    NONFINITE_METRICS,
    OUT_OF_DOMAIN_METRICS,
    RANKS_EXPECTED,
    RANKS_REPORTING,
    REPLICA_MISMATCHES,
    RUN_INFO,
    STEP,
    STEP_COMPLETE,
)

__all__ = [
    "ALERT_FIRING",
    "NONFINITE_METRICS",
    "NOTIFICATIONS",
    "OUTBOX_PENDING",
    "OUT_OF_DOMAIN_METRICS",
    "PARTIALS_DROPPED",
    "PARTIALS_INGESTED",
    "PARTIALS_LATE",
    "PARTIALS_REJECTED",
    "PROCESS_RSS",
    "RANKS_EXPECTED",
    "RANKS_REPORTING",
    "REPLICA_MISMATCHES",
    "RUN_INFO_SERIES",
    "SCRAPE_SECONDS",
    "SELF_METRICS",
    "SERIES",
    "SERIES_BUDGET",
    "SERIES_REFUSED",
    "STEP",
    "STEP_COMPLETE",
    "STREAMS_EXPIRED",
]

RUN_INFO_SERIES = RUN_INFO + "_info"
PARTIALS_INGESTED = "rlmon_partials_ingested_total"
PARTIALS_REJECTED = "rlmon_partials_rejected_total"
PARTIALS_LATE = "rlmon_partials_late_total"
PARTIALS_DROPPED = "rlmon_partials_dropped_total"
NOTIFICATIONS = "rlmon_notifications_total"  # labels destination, outcome (sent|retried|failed)
OUTBOX_PENDING = "rlmon_outbox_pending"  # label destination
SCRAPE_SECONDS = "rlmon_exporter_scrape_duration_seconds"
SERIES = "rlmon_exporter_series"
SERIES_BUDGET = "rlmon_exporter_series_budget"
SERIES_REFUSED = "rlmon_exporter_series_refused_total"
STREAMS_EXPIRED = "rlmon_exporter_streams_expired_total"
# client_python's process collector, registered beside rlmon's collector by the metrics server
PROCESS_RSS = "process_resident_memory_bytes"

SELF_METRICS = (PARTIALS_INGESTED, PARTIALS_REJECTED, PARTIALS_LATE, PARTIALS_DROPPED,
                NOTIFICATIONS, OUTBOX_PENDING, SCRAPE_SECONDS, SERIES, SERIES_BUDGET,
                SERIES_REFUSED, STREAMS_EXPIRED, RUN_INFO_SERIES)
