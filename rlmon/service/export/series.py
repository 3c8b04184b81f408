"""Every series the exporter shows beside the catalog's metrics, declared once.

The catalog names each training metric's family; this module names the rest: per (run, role)
stream state, alerts, run metadata and rlmon's own health (``rlmon_partials_*`` and the like).
Each :class:`Series` carries its exposition name, kind, help and labels; the exporter builds its
families from them; the list of exported families in docs/metrics.md and the self-monitoring
dashboard read them from here, so a rename is one edit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

__all__ = [
    "ALERT_COST",
    "ALERT_FIRING",
    "CUSTOM_METRIC",
    "GOODPUT",
    "GOODPUT_RATIO",
    "GOODPUT_ROLLED_BACK",
    "GOODPUT_SECONDS",
    "LAST_HEARD_TIME",
    "LAST_STEP_TIME",
    "LIVENESS",
    "MFU",
    "NONFINITE_METRICS",
    "NOTIFICATIONS",
    "OUTBOX_PENDING",
    "OUT_OF_DOMAIN_METRICS",
    "PARTIALS_DROPPED",
    "PARTIALS_INGESTED",
    "PARTIALS_LATE",
    "PARTIALS_REJECTED",
    "PARTIALS_RESENT",
    "PROCESS_RSS",
    "RANKS_EXPECTED",
    "RANKS_REPORTING",
    "REPLICA_MISMATCHES",
    "RUN_END",
    "RUN_INFO",
    "RUN_RESTARTS",
    "RUN_STATE",
    "SANITY_FINDINGS",
    "SCRAPE_SECONDS",
    "SELF_MONITORING",
    "SERIES",
    "SERIES_BUDGET",
    "SERIES_REFUSED",
    "STALL_THRESHOLD",
    "STATE_REMOVED",
    "STATISTICS_REFUSED",
    "STEP",
    "STEPS_REDELIVERED",
    "STEP_COMPLETE",
    "STEP_PERIOD",
    "STOP_REQUESTS",
    "STREAMS_EXPIRED",
    "STREAM_STATE",
    "Series",
]

Kind = Literal["counter", "gauge", "info"]


@dataclass(frozen=True, slots=True)
class Series:
    """One exported family: ``name`` as it appears in an exposition (a counter's ends in
    ``_total``, an info family's in ``_info``), ``help`` for the exposition and the docs."""

    name: str
    kind: Kind
    help: str
    labels: tuple[str, ...] = ()

    @property
    def family_name(self) -> str:
        """The name client_python's family constructors take (without the suffix they add)."""
        suffix = {"counter": "_total", "info": "_info"}.get(self.kind, "")
        return self.name.removesuffix(suffix)

    def family(self, value: float | None = None) -> CounterMetricFamily | GaugeMetricFamily:
        """An empty family (``value`` None) to add labelled samples to, or one unlabelled sample."""
        labels = None if value is not None else list(self.labels)
        if self.kind == "counter":
            return CounterMetricFamily(self.family_name, self.help, value=value, labels=labels)
        return GaugeMetricFamily(self.family_name, self.help, value=value, labels=labels)


_RUN_ROLE = ("run", "role")

# What the latest finalized step of each (run, role) says about itself.
STEP = Series("rlmon_step", "gauge", "Latest finalized step of the (run, role).", _RUN_ROLE)
STEP_COMPLETE = Series("rlmon_step_complete", "gauge",
                       "1 if every expected rank reported the latest step, else 0.", _RUN_ROLE)
RANKS_REPORTING = Series("rlmon_ranks_reporting", "gauge",
                         "Ranks that reported the latest step.", _RUN_ROLE)
RANKS_EXPECTED = Series("rlmon_ranks_expected", "gauge",
                        "Ranks expected to report each step (the world size).", _RUN_ROLE)
NONFINITE_METRICS = Series("rlmon_nonfinite_metrics", "gauge",
                           "Metrics of the latest step that are NaN or Inf.", _RUN_ROLE)
OUT_OF_DOMAIN_METRICS = Series("rlmon_out_of_domain_metrics", "gauge",
                               "Metrics of the latest step outside their physical domain.",
                               _RUN_ROLE)
REPLICA_MISMATCHES = Series("rlmon_replica_mismatches", "gauge",
                            "Metrics of the latest step whose replicated copies disagree.",
                            _RUN_ROLE)
STREAM_STATE = (STEP, STEP_COMPLETE, RANKS_REPORTING, RANKS_EXPECTED, NONFINITE_METRICS,
                OUT_OF_DOMAIN_METRICS, REPLICA_MISMATCHES)

# Liveness of each (run, role), by time (rlmon.service.liveness; docs/liveness.md): refreshed on
# the aggregator's timer whether or not steps arrive, so a hung run never looks like a finished one.
RUN_STATE = Series("rlmon_run_state", "gauge",
                   "1 for the (run, role)'s liveness state, 0 for the others (label `state`: "
                   "running, slow, stalled, dead, finished).", (*_RUN_ROLE, "state"))
LAST_STEP_TIME = Series("rlmon_last_step_timestamp_seconds", "gauge",
                        "Unix time the latest step of the (run, role) finalized (write your own "
                        "staleness rules as time() - this).", _RUN_ROLE)
LAST_HEARD_TIME = Series("rlmon_last_heartbeat_timestamp_seconds", "gauge",
                         "Unix time any rank of the (run, role) was last heard (a heartbeat or a "
                         "step message).", _RUN_ROLE)
STEP_PERIOD = Series("rlmon_step_period_seconds", "gauge",
                     "Typical step period of the (run, role): the median recent interval "
                     "between finalized steps.", _RUN_ROLE)
STALL_THRESHOLD = Series("rlmon_stall_threshold_seconds", "gauge",
                         "Seconds without a finalized step after which the (run, role) is "
                         "stalled: max(k x typical period, floor).", _RUN_ROLE)
RUN_END = Series("rlmon_run_end_info", "gauge",
                 "1 for a (run, role) that ended, saying how (label `state`: finished, failed, "
                 "preempted; `cause`: clean, owner_died, ray_kill, out_of_scope, "
                 "ray_job_succeeded, the exception type, exit_N, the signal; `stage`: where "
                 "it ended, \"\" for a clean end).", (*_RUN_ROLE, "state", "cause", "stage"))
LIVENESS = (RUN_STATE, LAST_STEP_TIME, LAST_HEARD_TIME, STEP_PERIOD, STALL_THRESHOLD, RUN_END)

CUSTOM_METRIC = Series("rlmon_custom_metric", "gauge",
                       "A metric outside the rlmon catalog (label `metric`; latest step).",
                       (*_RUN_ROLE, "metric"))
ALERT_FIRING = Series("rlmon_alert_firing", "gauge",
                      "1 while an rlmon alert fires (labels `alert`, `severity`).",
                      (*_RUN_ROLE, "alert", "severity"))
RUN_INFO = Series("rlmon_run_info", "info",
                  "Run metadata: framework and version, algorithm, loss reduction, dp/cp/tp/pp, "
                  "gradient accumulation, ZeRO stage, DeepSpeed version, dpo, the run's tags "
                  "joined by commas (set by `Reporter.set_run_info`).", ("run",))

# Where the GPU-hours go (docs/goodput.md): the step timelines' time by bucket.
GOODPUT_SECONDS = Series("rlmon_goodput_gpu_seconds_total", "counter",
                         "GPU-seconds of the run's accounted steps by `bucket` (productive, "
                         "overhead, idle, wasted) and `reason` (the span activity, why a rank "
                         "waited, or why work was wasted), per role.",
                         (*_RUN_ROLE, "bucket", "reason"))
GOODPUT_ROLLED_BACK = Series(
    "rlmon_goodput_rolled_back_gpu_seconds_total", "counter",
    "GPU-seconds already counted in rlmon_goodput_gpu_seconds_total as productive or overhead "
    "(`bucket`) that a later attempt of the run re-ran: wasted (rolled back) since; subtract "
    "them from their bucket (docs/goodput.md).", (*_RUN_ROLE, "bucket"))
GOODPUT_RATIO = Series("rlmon_goodput_ratio", "gauge",
                       "Productive GPU-seconds over all GPU-seconds of the run's accounted steps "
                       "(rolled-back work not productive).", ("run",))
MFU = Series("rlmon_goodput_mfu", "gauge",
             "Model FLOPs utilisation of the run so far (rollout tokens x the configured FLOPs "
             "per token over its GPU-seconds x the configured peak); only when both are "
             "configured.", ("run",))
ALERT_COST = Series("rlmon_alert_cost_gpu_hours", "gauge",
                    "GPU-hours a firing alert's condition has cost since its onset (the run's "
                    "GPUs x the time since; docs/goodput.md), by `alert`.",
                    (*_RUN_ROLE, "alert"))
GOODPUT = (GOODPUT_SECONDS, GOODPUT_ROLLED_BACK, GOODPUT_RATIO, MFU, ALERT_COST)

# rlmon's own health.
PARTIALS_INGESTED = Series("rlmon_partials_ingested_total", "counter",
                           "Metric partials merged into steps.")
PARTIALS_REJECTED = Series("rlmon_partials_rejected_total", "counter",
                           "Records rejected as invalid (the rest still counted).")
PARTIALS_LATE = Series("rlmon_partials_late_total", "counter",
                       "Records that arrived after their step was finalized.")
PARTIALS_DROPPED = Series("rlmon_partials_dropped_total", "counter",
                          "Records dropped by a full buffer.")
STATISTICS_REFUSED = Series("rlmon_statistics_refused_total", "counter",
                            "Statistics a Reporter refused before sending (a form the catalog "
                            "does not give the name, a malformed record_many statistic, a tensor "
                            "modified before it was reduced); the rest of their steps was sent. "
                            "The Reporter's last_error and log name the first.")
PARTIALS_RESENT = Series("rlmon_partials_resent_total", "counter",
                         "Step messages resent after an aggregator restart for steps it had "
                         "already finalized (folded in before; ignored, not late).")
RUN_RESTARTS = Series("rlmon_run_restarts_total", "counter",
                      "Reruns under an existing run name (steps starting again), recorded as the "
                      "run's next attempt.")
STEPS_REDELIVERED = Series("rlmon_steps_redelivered_total", "counter",
                           "Finalized steps delivered again after a restart; the history store "
                           "already held them, so they were ignored.")
NOTIFICATIONS = Series("rlmon_notifications_total", "counter",
                       "Notification attempts by `destination` and `outcome` (sent, retried, "
                       "failed; unroutable: alerts routed to a destination that is not "
                       "configured).", ("destination", "outcome"))
OUTBOX_PENDING = Series("rlmon_outbox_pending", "gauge",
                        "Notifications waiting in the outbox, by `destination`.", ("destination",))
STOP_REQUESTS = Series("rlmon_stop_requests_total", "counter",
                       "Runs asked to stop by a rule with the stop action that the config lets "
                       "stop them, by `alert`.", ("alert",))
SANITY_FINDINGS = Series("rlmon_sanity_findings_total", "counter",
                         "Sanity-layer findings by `kind` (loss stuck at ln 2 / ln 3, known "
                         "DeepSpeed NaN grad-norm bug, collapsing loss scale).", ("kind",))
STATE_REMOVED = Series("rlmon_state_removed_total", "counter",
                       "Per-run and per-name state that left memory or the stores (quiet or "
                       "finished streams, forgotten metric names, history and watermark "
                       "retention) or was cut to fit a bound (sample payloads, timeline spans), "
                       "by `component` and `kind`.", ("component", "kind"))
SERIES = Series("rlmon_exporter_series", "gauge", "Series under the cardinality budget.")
SERIES_BUDGET = Series("rlmon_exporter_series_budget", "gauge", "The cardinality budget.")
SERIES_REFUSED = Series("rlmon_exporter_series_refused_total", "counter",
                        "Series refused because the cardinality budget was full.")
STREAMS_EXPIRED = Series("rlmon_exporter_streams_expired_total", "counter",
                         "(run, role) streams removed after their TTL.")
SCRAPE_SECONDS = Series("rlmon_exporter_scrape_duration_seconds", "gauge",
                        "Time the previous scrape took to build.")
SELF_MONITORING = (PARTIALS_INGESTED, PARTIALS_REJECTED, PARTIALS_LATE, PARTIALS_DROPPED,
                   STATISTICS_REFUSED, PARTIALS_RESENT, RUN_RESTARTS, STEPS_REDELIVERED,
                   NOTIFICATIONS, OUTBOX_PENDING, STOP_REQUESTS, SANITY_FINDINGS, STATE_REMOVED,
                   SERIES, SERIES_BUDGET, SERIES_REFUSED, STREAMS_EXPIRED, SCRAPE_SECONDS)

# client_python's process collector, registered beside rlmon's collector by the metrics server.
PROCESS_RSS = Series("process_resident_memory_bytes", "gauge", "Resident memory size in bytes.")
