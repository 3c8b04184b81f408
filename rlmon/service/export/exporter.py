"""The Prometheus exporter: a custom Collector that renders the latest finalized step at scrape time.

Nothing is mutated on the hot path but a dict entry per (run, role): ``update`` stores the newest
:class:`StepRecord` and the alert transitions, and ``collect`` builds every family from a snapshot
taken under a lock (client_python's "custom collector" pattern). Series are bounded by a
cardinality budget (refused series are counted, not silently dropped) and a run that finished or
stopped reporting disappears after a TTL instead of freezing at its last value.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from rlmon.service.aggregation.aggregator_stats import AggregatorStats
from rlmon.service.alerting.engine import AlertEvent
from rlmon.service.clock import Clock
from rlmon.service.contract.run_info import RunInfo
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.export import series
from rlmon.service.liveness.run_state import LivenessView, RunState, end_cause
from rlmon.service.metrics import catalog
from rlmon.service.redact import Redactor

__all__ = [
    "MetricsState",
    "RlmonCollector",
    "exported_families",
    "exported_metric_names",
    "sanitize_label",
]

_STREAM_SERIES = len(series.STREAM_STATE)
_LIVENESS_SERIES = len(RunState) + len(series.LIVENESS) - 1
# kept on /metrics until resolved, finished or rerun
_HELD = (RunState.STALLED, RunState.DEAD, RunState.FROZEN, RunState.FAILED, RunState.PREEMPTED)

_MAX_LABEL = 128


def sanitize_label(value: object, redactor: Redactor | None = None) -> str:
    """A safe label value: secrets masked, control characters dropped, at most 128 characters."""
    text = str(value)
    if redactor:
        text = redactor(text)
    text = "".join(ch for ch in text if ch.isprintable())
    return text if len(text) <= _MAX_LABEL else text[: _MAX_LABEL - 3] + "..."


@dataclass(slots=True)
class _Stream:
    record: StepRecord
    seen: float
    names: set[str] = field(default_factory=set)  # admitted metric families
    firing: dict[str, str] = field(default_factory=dict)  # alert -> severity


# name -> (family, domain), computed once: prometheus_name is too slow to derive per sample
_FAMILIES = {spec.name: (spec.prometheus_name, spec.domain) for spec in catalog.metrics()}


class MetricsState:
    """What the exporter shows: the newest step per (run, role), alerts firing, run metadata.

    ``update`` is cheap and thread-safe; :class:`RlmonCollector` reads a snapshot at scrape time.
    """

    def __init__(
        self, *, max_series: int = 10_000, run_ttl: float = 900.0, finished_ttl: float = 120.0,
        clock: Clock | None = None, redactor: Redactor | None = None,
    ) -> None:
        self.max_series = max_series
        self.run_ttl = run_ttl
        self.finished_ttl = finished_ttl
        self.redactor = redactor
        self._clock: Clock = clock or time.monotonic
        self._lock = threading.Lock()
        self._streams: dict[tuple[str, str], _Stream] = {}
        self._info: dict[str, RunInfo] = {}
        self._info_set: dict[str, float] = {}
        self._finished: dict[str, float] = {}
        self._series = 0
        # (run, role) -> its latest liveness view, the liveness alerts firing, when it was set
        self._liveness: dict[tuple[str, str], tuple[LivenessView, dict[str, str], float]] = {}
        self._refused: set[tuple[str, str, str]] = set()
        self.refused_total = 0
        self.expired_total = 0
        # what the aggregators counted, summed over the shards; the steps the service ignored
        # as already stored (redelivered)
        self.ingest: Callable[[], AggregatorStats] | None = None
        self.redelivered: Callable[[], int] | None = None
        self.dispatch: Callable[[], Any] | None = None  # -> notify.DispatchStats
        self.sanity: Callable[[], Mapping[str, int]] | None = None  # findings by kind
        self.stops: Callable[[], Mapping[str, int]] | None = None  # stop requests by alert
        # (component, kind) -> count of state removed by expiry and retention
        self.removed: Callable[[], Mapping[tuple[str, str], int]] | None = None
        # run -> (GPU-seconds by (role, bucket, reason), goodput, MFU or None)
        self.goodput: Callable[[], Mapping[str, tuple[Mapping[Any, float], float,
                                                     float | None]]] | None = None
        # run -> (role, bucket) -> GPU-seconds counted productive/overhead, then rolled back
        self.goodput_rolled_back: Callable[[], Mapping[str, Mapping[tuple[str, Any], float]]] \
            | None = None
        # (run, role, alert) -> GPU-hours its condition has cost so far, for the alerts firing
        self.alert_costs: Callable[[], Mapping[tuple[str, str, str], float]] | None = None
        self.last_scrape_seconds = 0.0

    # --- writers ---------------------------------------------------------------------------------

    def _refuse(self, key: tuple[str, str, str], n: int = 1) -> None:
        if key not in self._refused:
            if len(self._refused) < 100_000:
                self._refused.add(key)
            self.refused_total += n

    def update(self, record: StepRecord, events: Sequence[AlertEvent] = ()) -> None:
        """Show ``record`` as the latest step of its (run, role); apply its alert transitions."""
        key = (record.run, record.role)
        now = self._clock()
        with self._lock:
            self._expire(now)
            stream = self._streams.get(key)
            if stream is None:
                if self._series + _STREAM_SERIES > self.max_series:
                    self._refuse((record.run, record.role, ""), _STREAM_SERIES)
                    return
                stream = self._streams[key] = _Stream(record, now)
                self._series += _STREAM_SERIES
            elif (record.attempt, record.step) < (stream.record.attempt, stream.record.step):
                return  # an older step never replaces a newer one (a rerun's steps are newer)
            stream.record, stream.seen = record, now
            finished = self._finished.get(record.run)
            if finished is not None and now - finished >= self.finished_ttl:
                # steps long after the end: the run resumed. Steps within the TTL are its tail
                # (finalized after the Reporter said it finished) and keep it finished.
                del self._finished[record.run]
            for metric in record.metrics:
                if metric not in stream.names:
                    if self._series >= self.max_series:
                        self._refuse((record.run, record.role, metric))
                        continue
                    stream.names.add(metric)
                    self._series += 1
            for event in events:
                if event.state == "firing" and event.alert not in stream.firing:
                    if self._series >= self.max_series:
                        self._refuse((record.run, record.role, "alert:" + event.alert))
                        continue
                    stream.firing[event.alert] = event.severity
                    self._series += 1
                elif event.state == "resolved" and event.alert in stream.firing:
                    del stream.firing[event.alert]
                    self._series -= 1

    def set_liveness(self, view: LivenessView, firing: Mapping[str, str]) -> None:
        """Show a (run, role)'s liveness (state, last step, last heard) and its liveness alerts
        firing (alert -> severity). A stalled or dead stream keeps every series it has."""
        key = (view.run, view.role)
        now = self._clock()
        with self._lock:
            known = self._liveness.get(key)
            if known is None:
                if self._series + _LIVENESS_SERIES + len(firing) > self.max_series:
                    self._refuse((view.run, view.role, "liveness"), _LIVENESS_SERIES)
                    return
                self._series += _LIVENESS_SERIES
            else:
                self._series -= len(known[1])
            self._series += len(firing)
            self._liveness[key] = (view, dict(firing), now)

    def liveness_states(self) -> dict[tuple[str, str], str]:
        """The liveness state of each (run, role) shown (the run page's runs table)."""
        with self._lock:
            return {key: view.state.value for key, (view, _f, _at) in self._liveness.items()}

    def set_run_info(self, run: str, info: RunInfo) -> None:
        """Metadata may arrive before the run's first step; it lives as long as a stream would."""
        with self._lock:
            self._info[run] = info
            self._info_set[run] = self._clock()

    def finish_run(self, run: str) -> None:
        """The run ended: its series disappear ``finished_ttl`` seconds from now."""
        with self._lock:
            self._finished[run] = self._clock()

    def _expire(self, now: float) -> None:
        for key, (view, firing, at) in list(self._liveness.items()):
            if view.state in _HELD:
                continue
            ttl = self.finished_ttl if view.state is RunState.FINISHED else self.run_ttl
            if now - at >= ttl:
                del self._liveness[key]
                self._series -= _LIVENESS_SERIES + len(firing)
        for key in list(self._streams):
            stream = self._streams[key]
            live = self._liveness.get(key)
            if live is not None and live[0].state in _HELD:
                continue  # a hung or dead run stays in view, its last step with it
            finished = self._finished.get(key[0])
            dead = now - stream.seen >= self.run_ttl
            done = finished is not None and now - finished >= self.finished_ttl
            if dead or done:
                del self._streams[key]
                self._series -= _STREAM_SERIES + len(stream.names) + len(stream.firing)
                self.expired_total += 1
        live_runs = {run for run, _ in self._streams}
        for run in [r for r in self._info if r not in live_runs]:
            finished = self._finished.get(run)
            if finished is None:
                expired = now - self._info_set.get(run, now) >= self.run_ttl
            else:
                expired = now - finished >= self.finished_ttl
            if expired:
                self._info.pop(run, None)
                self._info_set.pop(run, None)
                self._finished.pop(run, None)
        for run in [r for r, at in self._finished.items()  # a finish of a run never shown
                    if r not in live_runs and r not in self._info and now - at >= self.finished_ttl]:
            del self._finished[run]
        if self._refused and self._series < self.max_series:
            self._refused.clear()  # room again: a refused series may be admitted next step

    def snapshot(self) -> _Snapshot:
        with self._lock:
            self._expire(self._clock())
            streams = [
                (s.record, frozenset(s.names), dict(s.firing)) for s in self._streams.values()
            ]
            return _Snapshot(streams, dict(self._info), self._series, self.refused_total,
                             self.expired_total,
                             [(view, dict(firing)) for view, firing, _ in self._liveness.values()])

    @property
    def series(self) -> int:
        with self._lock:
            return self._series


@dataclass(frozen=True, slots=True)
class _Snapshot:
    streams: list[tuple[StepRecord, frozenset[str], dict[str, str]]]
    info: Mapping[str, RunInfo]
    series: int
    refused: int
    expired: int
    liveness: list[tuple[LivenessView, dict[str, str]]] = field(default_factory=list)


def _gauge(name: str, doc: str, labels: Sequence[str], unit: str = "") -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels, unit=unit)


def _catalog_doc(spec: catalog.MetricSpec) -> str:
    return f"{spec.help} ({spec.name}; unit {spec.unit.value})"


class RlmonCollector(Collector):
    """Builds rlmon's exposition from :class:`MetricsState` at scrape time."""

    def __init__(self, state: MetricsState) -> None:
        self.state = state

    def update(self, record: StepRecord, events: Sequence[AlertEvent] = ()) -> None:
        self.state.update(record, events)

    def describe(self) -> Iterator[Metric]:
        return iter(())  # families depend on what arrived; registering must not scrape

    def collect(self) -> Iterator[Metric]:
        started = time.perf_counter()
        state = self.state
        snap = state.snapshot()
        clean = state.redactor

        def lab(value: object) -> str:
            return sanitize_label(value, clean)

        families: dict[str, GaugeMetricFamily] = {
            family: _gauge(family, _catalog_doc(catalog.get(name)), ["run", "role"])
            for name, (family, _) in _FAMILIES.items()
        }
        custom = series.CUSTOM_METRIC.family()
        stream_fams = [s.family() for s in series.STREAM_STATE]
        firing = series.ALERT_FIRING.family()
        for record, names, alerts in snap.streams:
            run, role = lab(record.run), lab(record.role)
            values = record.metrics
            nonfinite = sum(1 for v in values.values() if not math.isfinite(v))
            out_of_domain = 0
            for metric, value in values.items():
                known = _FAMILIES.get(metric)
                if known is not None and math.isfinite(value) and not known[1].contains(value):
                    out_of_domain += 1
                if metric not in names:
                    continue
                if known is not None:
                    families[known[0]].add_metric([run, role], value)
                else:
                    custom.add_metric([run, role, lab(metric)], value)
            stream_values = (
                record.step, 1.0 if record.complete else 0.0, record.ranks_reporting,
                record.ranks_expected, nonfinite, out_of_domain, len(record.replica_mismatches),
            )
            for fam, value in zip(stream_fams, stream_values, strict=True):
                fam.add_metric([run, role], float(value))
            for alert, severity in sorted(alerts.items()):
                firing.add_metric([run, role, lab(alert), lab(severity)], 1.0)
        yield from families.values()
        yield custom
        yield from stream_fams
        yield from self._liveness_families(snap, firing, lab)
        yield firing
        info = InfoMetricFamily(series.RUN_INFO.family_name, series.RUN_INFO.help,
                                labels=list(series.RUN_INFO.labels))
        for run, meta in sorted(snap.info.items()):
            info.add_metric([lab(run)], {k: lab(v) for k, v in meta.labels().items()})
        yield info
        yield from self._goodput(lab)
        yield from self._self_metrics(snap)
        state.last_scrape_seconds = time.perf_counter() - started

    def _goodput(self, lab: Callable[[object], str]) -> Iterator[Metric]:
        seconds = series.GOODPUT_SECONDS.family()
        ratio = series.GOODPUT_RATIO.family()
        utilisation = series.MFU.family()
        runs = self.state.goodput() if self.state.goodput is not None else {}
        for run, (by_key, goodput, mfu) in sorted(runs.items()):
            for (role, bucket, reason), value in sorted(by_key.items()):
                seconds.add_metric([lab(run), lab(role), str(bucket), reason], value)
            if math.isfinite(goodput):
                ratio.add_metric([lab(run)], goodput)
            if mfu is not None and math.isfinite(mfu):
                utilisation.add_metric([lab(run)], mfu)
        yield seconds
        undone = series.GOODPUT_ROLLED_BACK.family()
        rolled = (self.state.goodput_rolled_back() if self.state.goodput_rolled_back is not None
                  else {})
        for run, parts in sorted(rolled.items()):
            for (role, bucket), value in sorted(parts.items(), key=lambda kv: str(kv[0])):
                undone.add_metric([lab(run), lab(role), str(bucket)], value)
        yield undone
        yield ratio
        yield utilisation
        costs = series.ALERT_COST.family()
        for (run, role, alert), gpu_hours in sorted(
                (self.state.alert_costs() if self.state.alert_costs is not None else {}).items()):
            costs.add_metric([lab(run), lab(role), lab(alert)], gpu_hours)
        yield costs

    @staticmethod
    def _liveness_families(snap: _Snapshot, firing: GaugeMetricFamily | CounterMetricFamily,
                           lab: Callable[[object], str]) -> Iterator[Metric]:
        fams = [declared.family() for declared in series.LIVENESS]
        state, last_step, last_heard, period, threshold, end = fams
        for view, alerts in snap.liveness:
            run, role = lab(view.run), lab(view.role)
            for name in RunState:
                state.add_metric([run, role, name.value], 1.0 if view.state is name else 0.0)
            if view.state in (RunState.FINISHED, RunState.FAILED, RunState.PREEMPTED):
                cause, stage = end_cause(view)
                end.add_metric([run, role, view.state.value, lab(cause), lab(stage)], 1.0)
            for fam, value in ((last_step, view.last_step_at), (last_heard, view.last_heard),
                               (period, view.period), (threshold, view.threshold)):
                if value is not None:
                    fam.add_metric([run, role], float(value))
            for alert, severity in sorted(alerts.items()):
                firing.add_metric([run, role, lab(alert), lab(severity)], 1.0)
        yield from fams

    def _self_metrics(self, snap: _Snapshot) -> Iterator[Metric]:
        state = self.state
        ingest = state.ingest() if state.ingest is not None else AggregatorStats()
        for declared, value in (
            (series.PARTIALS_INGESTED, ingest.partials),
            (series.PARTIALS_REJECTED, ingest.rejected),
            (series.PARTIALS_LATE, ingest.late),
            (series.PARTIALS_DROPPED, ingest.reporter_dropped),
            (series.STATISTICS_REFUSED, ingest.reporter_refused),
            (series.RUN_RESTARTS, ingest.restarts),
            (series.STEPS_REDELIVERED, state.redelivered() if state.redelivered else 0),
            (series.PARTIALS_RESENT, ingest.resent),
        ):
            yield declared.family(float(value))
        outcomes = series.NOTIFICATIONS.family()
        pending = series.OUTBOX_PENDING.family()
        if state.dispatch is not None:
            stats = state.dispatch()
            for (dest, outcome), n in sorted(stats.outcomes.items()):
                outcomes.add_metric([dest, outcome], float(n))
            for dest, n in sorted(stats.pending.items()):
                pending.add_metric([dest], float(n))
        yield outcomes
        yield pending
        stops = series.STOP_REQUESTS.family()
        for alert, n in sorted((state.stops() if state.stops is not None else {}).items()):
            stops.add_metric([alert], float(n))
        yield stops
        findings = series.SANITY_FINDINGS.family()
        for kind, n in sorted((state.sanity() if state.sanity is not None else {}).items()):
            findings.add_metric([kind], float(n))
        yield findings
        removed = series.STATE_REMOVED.family()
        for (component, kind), n in sorted((state.removed() if state.removed else {}).items()):
            removed.add_metric([component, kind], float(n))
        yield removed
        yield series.SERIES.family(float(snap.series))
        yield series.SERIES_BUDGET.family(float(state.max_series))
        yield series.SERIES_REFUSED.family(float(snap.refused))
        yield series.STREAMS_EXPIRED.family(float(snap.expired))
        yield series.SCRAPE_SECONDS.family(state.last_scrape_seconds)


def exported_families() -> list[tuple[str, str]]:
    """(name, help) of every family a scrape can show, catalog first (for docs/metrics.md)."""
    out = [(spec.prometheus_name, spec.help) for spec in catalog.metrics()]
    others = (series.CUSTOM_METRIC, *series.STREAM_STATE, *series.LIVENESS, series.ALERT_FIRING,
              series.RUN_INFO,
              *series.GOODPUT, *series.SELF_MONITORING)
    return out + [(declared.name, declared.help) for declared in others]


def exported_metric_names() -> list[str]:
    return [name for name, _ in exported_families()]
