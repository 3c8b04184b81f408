"""The service: exporter HTTP server, alert engine with its notifiers, and the history store.

:class:`ServiceCore` is plain Python (tests drive it in-process);
:mod:`rlmon.actors.service_actor` wraps it as the named Ray actor that aggregators publish
finalized steps to. Publishing is idempotent: a
step the history store already holds (a redelivery after an aggregator restart) is ignored, so it
is neither exported, evaluated nor notified twice. A step, its alert transitions and the
notifications they owe are one commit of the history store; the notifications then move to the
outbox, and whatever a crash left in between moves on the next start (see
:mod:`rlmon.service.crash_points` for the commit points a test kills the process at).

What it keeps is bounded (config ``retention``): per-(run, role) state in memory leaves when the
stream goes quiet, finishes or is crowded out (:mod:`rlmon.service.aggregation.stream_tracker`; it comes back
from the history store with the stream's next step), and the history store keeps the newest steps
of each stream and drops runs quiet for days. What leaves is counted in ``removed``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from rlmon.service.aggregation.aggregator_stats import AggregatorStats
from rlmon.service.aggregation.stream_tracker import Expired, Stream, StreamTracker
from rlmon.service.alerting.alert_types import AlertEvent
from rlmon.service.alerting.engine import AlertEngine
from rlmon.service.alerting.first_mover import FirstMovers
from rlmon.service.alerting.liveness_alerts import liveness_events, liveness_firing
from rlmon.service.alerting.notify.factory import build_dispatcher, open_outbox, outbox_path
from rlmon.service.alerting.notify.render import summary_line
from rlmon.service.alerting.rank_missing import detail as rank_missing_detail
from rlmon.service.alerting.rules import Rule, default_rules, load_rules, unknown_metrics
from rlmon.service.alerting.run_end import close_with_run
from rlmon.service.alerting.sanity import Finding, SanityChecker, checker_args, relay_warnings
from rlmon.service.config import Settings, load_config
from rlmon.service.contract.run_info import RunInfo
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.contract.stop_decision import STOP, StopDecision
from rlmon.service.crash_points import crash_point
from rlmon.service.export.exporter import IngestCounters, MetricsState
from rlmon.service.export.http import MetricsServer, serve_metrics
from rlmon.service.export.otlp import OtlpExport
from rlmon.service.forward.sink import ForwardSink
from rlmon.service.goodput.alert_costs import AlertCosts
from rlmon.service.goodput.ledger import GoodputLedger
from rlmon.service.liveness.run_state import LivenessView, RankSeen, RunState, describe
from rlmon.service.metrics import catalog, keymaps, remedies
from rlmon.service.metrics.rank import Rank
from rlmon.service.redact import install_redaction
from rlmon.service.storage.history import HistoryStore
from rlmon.service.storage.stored_samples import notify_items

__all__ = ["ServiceCore"]

log = logging.getLogger("rlmon.sanity")
_log = logging.getLogger("rlmon.service")
_MAX_STOPS = 1_000  # stop decisions kept in memory (the newest; all are in the history store)
_UNSAID = RunInfo().labels()  # a run's settings at these values were not reported


def _run_info(info: RunInfo | Mapping[str, Any]) -> RunInfo:
    return info if isinstance(info, RunInfo) else RunInfo.from_fields(info)


class ServiceCore:
    """Everything downstream of step assembly, owned by one process."""

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        state_dir: str | Path | None = None,
        port: int | None = None,
        host: str | None = None,
        rules: Sequence[Rule] | None = None,
        transports: Mapping[str, Any] | None = None,
        port_fallback: bool = False,
        clock: Callable[[], float] | None = None,
    ) -> None:
        """Builds the core and starts no thread: :meth:`start` starts them, the HTTP server
        among them. ``port`` None: no HTTP server; with ``port_fallback`` a taken port gives way
        to a free one (the embedded default), otherwise :meth:`start` raises. ``clock`` (unix seconds) drives
        expiry and retention (tests inject a simulated one)."""
        self.settings = settings or load_config()
        self._clock = clock or time.time
        state = Path(state_dir) if state_dir is not None else None
        if state is not None:
            state.mkdir(parents=True, exist_ok=True)
        self.history = HistoryStore(
            state / "history.sqlite" if state else ":memory:",
            sample_payload_bytes=self.settings.retention.sample_payload_bytes)
        self.engine = AlertEngine(list(rules) if rules is not None else default_rules())
        for warning in unknown_metrics(self.engine.rules) if rules is not None else ():
            _log.warning("rlmon: %s", warning)
        # A restarted service continues every (run, role, alert) where it stopped: a firing
        # alert still resolves, a pending one still needs only its remaining bad steps.
        restored = self.history.alert_states()
        self.engine.restore(restored, self.history.last_steps(), self.history.latest_attempts())
        self._restored_firing: dict[tuple[str, str], list[str]] = {}
        for (run, role, alert), st in restored.items():
            if st.firing:
                self._restored_firing.setdefault((run, role), []).append(alert)
        retention = self.settings.retention
        self.removed: Counter[str] = Counter()  # what retention and expiry took, by kind
        self._tracker = StreamTracker(retention.stream_ttl_seconds,
                                      retention.finished_ttl_seconds, retention.max_streams)
        self._next_retention = self._clock() + retention.every_seconds
        self.outbox_path = outbox_path(self.settings, state)
        outbox = open_outbox(self.settings, self.outbox_path)
        self.dispatcher = build_dispatcher(self.settings, outbox, transports=transports,
                                           state_dir=state.resolve() if state else None)
        # after the notifier modules (and their clients' loggers) exist
        install_redaction(self.settings.secret_values())
        self._redactor = self.settings.redactor()  # masks secrets in sample text sent out
        self._handover_lock = threading.Lock()
        self._hand_over()  # what a crash left between the history store and the outbox
        exp = self.settings.exporter
        self.metrics = MetricsState(
            max_series=exp.max_series, run_ttl=exp.run_ttl_seconds,
            finished_ttl=exp.finished_run_ttl_seconds, redactor=self.settings.redactor(),
            clock=clock,
        )
        self.metrics.dispatch = self.dispatcher.stats
        # where the GPU-hours go (goodput by bucket) and what each alert has cost since onset
        self.goodput = GoodputLedger(self.settings.goodput)
        self.costs = AlertCosts(self.goodput.price, self.goodput.run_gpus)
        self.costs.restore(restored)  # alerts firing across a restart keep counting
        if self.settings.liveness.gpus_per_rank != 1.0:
            _log.warning("rlmon: liveness.gpus_per_rank is no longer read: a stall costs what "
                         "every alert costs, with goodput.gpus_per_rank (docs/goodput.md)")
        self.metrics.goodput = self.goodput.snapshot
        self.metrics.goodput_rolled_back = self.goodput.rolled_back
        self.metrics.alert_costs = lambda: self.costs.firing(self._clock())
        # The sanity layer looks at each (run, role)'s steps for values that look like training
        # bugs but have known causes; findings are logged, kept and counted, not paged.
        self.sanity: dict[tuple[str, str], SanityChecker] = {}
        self.run_info: dict[str, RunInfo] = {}
        self._relayed: dict[str, set[str]] = {}  # relayed key names already checked, per run
        # the related metrics' recent values per run: what moved first before a firing
        self.first_movers = FirstMovers()
        self.findings: deque[Finding] = deque(maxlen=1_000)
        self.finding_counts: Counter[str] = Counter()
        self.metrics.sanity = lambda: dict(self.finding_counts)
        self._shard_stats: dict[int, AggregatorStats] = {}
        self.metrics.ingest = self._ingest_counters
        self.metrics.removed = self._removed_counts
        self.events: deque[AlertEvent] = deque(maxlen=10_000)
        self.otlp: OtlpExport | None = None  # built by start() when otlp.enabled
        # steps, alerts, settings and ends to W&B / MLflow / TensorBoard (config forward): only
        # queued here; its threads start with start()
        self.forward = ForwardSink(self.settings.forward)
        self.redeliveries = 0
        self._finished_runs: dict[str, float] = {}  # run -> unix time it said finish_run
        self._deferred: Expired | None = None  # left the tracker during the batch being stored
        self._live_states: dict[tuple[str, str], RunState] = {}  # last stored, per stream
        # per stream, where its silent or ended ranks were last heard (RankMissing names it)
        self._last_seen: dict[tuple[str, str], dict[Rank, RankSeen]] = {}
        # The stop switch (rlmon.service.contract.stop_decision): the rules that carry the stop action, the
        # decisions taken (restored from the history store) and how many, by alert.
        self._stoppers = {r.name for r in self.engine.rules if STOP in r.actions}
        self.stops: dict[str, StopDecision] = {
            d.run: d for d in reversed(self.history.stops(limit=_MAX_STOPS))}
        self.stop_counts: Counter[str] = Counter()
        self.metrics.stops = lambda: dict(self.stop_counts)
        if self._stoppers and not self.settings.stop.runs:
            _log.warning("rlmon: rules %s carry the stop action, but the config's stop.runs lets "
                         "them stop no run", ", ".join(sorted(self._stoppers)))
        elif self.settings.stop.runs and not self._stoppers:
            _log.warning("rlmon: the config's stop.runs is set, but no rule carries the stop "
                         "action (actions: [stop] in the rule file)")
        self._lock = threading.Lock()
        now = self._clock()
        for stream in sorted(self.engine.streams()):
            self._forget(self._tracker.seen(stream, now))  # restored streams age from now
        self.server: MetricsServer | None = None
        self.wanted_port = port
        self.host = host or exp.host
        self._state, self._port_fallback = state, port_fallback
        self._web_reader: HistoryStore | None = None
        self._web_warmer: Any = None
        self._started = False

    def start(self) -> ServiceCore:
        """Start the threads beside the alert path: the notifiers' deliveries, the goodput
        ledger's accounting, the OTLP span export and, with a ``port``, the /metrics and run-page
        server with its cache warmer. The service actor and ``rlmon serve`` call it once the
        core is built; a test that drives the core on its own thread does not (delivery then
        waits for ``dispatcher.drain`` or :meth:`close`, and the ledger accounts as it is
        woken). Returns the core."""
        if self._started:
            return self
        self._started = True
        self.dispatcher.start()
        self.goodput.start()
        self.forward.start()  # the trackers' threads (config forward), if any
        if self.settings.otlp.enabled:  # the step timelines' spans, to an OTLP/HTTP collector
            self.otlp = OtlpExport(self.settings.otlp)
        port, state = self.wanted_port, self._state
        if port is not None:
            web = self._web_app(state)
            try:
                self.server = serve_metrics(self.metrics, port, self.host, health=self.healthy,
                                            web=web, hosts=web.hosts)
            except OSError as exc:
                if not self._port_fallback:
                    self.close(0.0)
                    raise OSError(exc.errno, f"rlmon: the requested port {port} on {self.host} "
                                  f"is taken ({exc.strerror}); free it or ask for another "
                                  "(--port, RLMON_PORT, exporter.port; 0 takes any free "
                                  "port)") from exc
                _log.warning("rlmon: port %s on %s is taken (%s); serving /metrics on a free "
                             "port", port, self.host, exc)
                self.server = serve_metrics(self.metrics, 0, self.host, health=self.healthy,
                                            web=web, hosts=web.hosts)
        return self

    def _web_app(self, state: Path | None) -> Any:
        """The run page (rlmon.service.web): it reads the history store through its own
        read-only connection, never under the lock the alert path writes with (an in-memory
        store, in tests, has only the one connection)."""
        import ipaddress
        from urllib.parse import urlsplit

        from rlmon.service.web.api import WebApi
        from rlmon.service.web.server import CacheWarmer, HostCheck, WebApp

        reader = self.history
        if state is not None:
            reader = self._web_reader = HistoryStore(state / "history.sqlite", read_only=True)
        token = self.settings.exporter.token
        try:
            loopback = ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            loopback = self.host == "localhost"
        if not loopback and token is None:
            _log.warning("rlmon: the run page and /api/ on %s are open to whoever reaches it "
                         "(worst samples included): set exporter.token_file or "
                         "RLMON_EXPORTER__TOKEN (docs/page.md)", self.host)
        api = WebApi(reader, self.engine.rules, states=self.metrics.liveness_states,
                     goodput=lambda: {run: g for run, (_s, g, _m) in
                                      self.goodput.snapshot().items()},
                     run_info=lambda: {run: {k: v for k, v in info.labels().items()
                                             if v != _UNSAID.get(k)}
                                       for run, info in dict(self.run_info).items()},
                     gpus=self.goodput.run_gpus, price=self.goodput.price)
        if state is not None:
            self._web_warmer = CacheWarmer(api)
        public = urlsplit(self.settings.run_page() or "").hostname
        hosts = HostCheck(self.host, [*self.settings.exporter.allowed_hosts,
                                      *([public] if public else [])])
        return WebApp(api, token.get_secret_value() if token is not None else None, hosts)

    @classmethod
    def from_config(
        cls, config: str | Path | None, *, state_dir: str | Path | None = None,
        port: int | None = None, host: str | None = None, rules: str | Path | None = None,
        port_fallback: bool = False,
    ) -> ServiceCore:
        settings = load_config(config)
        return cls(settings, state_dir=state_dir, port=port, host=host,
                   rules=load_rules(str(rules)) if rules is not None else None,
                   port_fallback=port_fallback)

    def _ingest_counters(self) -> IngestCounters:
        stats = list(self._shard_stats.values())
        return IngestCounters(
            ingested=sum(s.partials for s in stats),
            rejected=sum(s.rejected for s in stats),
            late=sum(s.late for s in stats),
            dropped=sum(s.reporter_dropped for s in stats),
            refused=sum(s.reporter_refused for s in stats),
            restarts=sum(s.restarts for s in stats),
            resent=sum(s.resent for s in stats),
            redelivered=self.redeliveries,
        )

    def _removed_counts(self) -> dict[tuple[str, str], int]:
        """What expiry and retention removed, here and in every aggregator shard."""
        out = {("service", kind): n for kind, n in self.removed.items()}
        out.update(self.forward.removed())
        for stats in list(self._shard_stats.values()):
            for kind, n in stats.removed.items():
                out[("aggregator", kind)] = out.get(("aggregator", kind), 0) + n
        return out

    @property
    def port(self) -> int | None:
        return self.server.port if self.server is not None else None

    def healthy(self) -> tuple[bool, str]:
        """(ok, reason) for ``/healthz``: unhealthy when alerts could no longer be delivered or
        stored (a delivery thread died, the history store is closed)."""
        dead = self.dispatcher.dead_threads()
        if dead:
            return False, f"delivery thread(s) not running: {', '.join(dead)}"
        if self.history.closed:
            return False, "history store closed"
        return True, "ok"

    def publish(
        self, records: Sequence[StepRecord], shard: int = 0,
        stats: AggregatorStats | None = None,
    ) -> list[AlertEvent]:
        """Export, evaluate, store and notify finalized steps; returns the alert transitions."""
        events: list[AlertEvent] = []
        # latency is measured from the step's finalization, not from this call
        batches: list[tuple[float | None, list[AlertEvent]]] = []
        with self._lock:
            if stats is not None:
                if not isinstance(stats, AggregatorStats):
                    raise TypeError(f"stats must be an AggregatorStats, got {type(stats).__name__}")
                self._shard_stats[shard] = stats
            fresh = []
            for record in sorted(records, key=lambda r: r.identity):
                if self.history.has_step(*record.key, record.attempt):
                    self.redeliveries += 1
                    if self.redeliveries == 1:
                        _log.warning("rlmon: %s/%s step %d (attempt %d) is already stored: a "
                                     "redelivery, ignored; counted in "
                                     "rlmon_steps_redelivered_total (said once)", record.run,
                                     record.role, record.step, record.attempt)
                    continue
                fresh.append(record)
            streams: set[tuple[str, str]] = set()
            decided: dict[str, StopDecision] = {}
            now = self._clock()
            # nothing leaves memory before the batch is stored (kept if a failed batch left some)
            self._deferred = self._deferred or Expired()
            for record in fresh:  # first: an alert's cost counts the GPUs of every role
                self.goodput.add(record)
            for record in fresh:
                self._remember((record.run, record.role), now)
                self.first_movers.observe(record)
                mine = self.costs.stamp(record, self.engine.evaluate(record), [
                    (alert, st) for (_r, _o, alert), st
                    in self.engine.stream_states(record.run, record.role).items()])
                mine = self._decide_stops(record, mine, now, decided)
                if mine:
                    mine = self._explain(record, mine)
                    mine = self._with_last_seen(record, mine)
                if record.samples:
                    mine = self._with_samples(record, mine)
                streams.add((record.run, record.role))
                self.metrics.update(record, self._restored(record) + mine)
                events.extend(mine)
                if mine:
                    batches.append((record.finalized_at, mine))
                self._check_sanity(record)
            crash_point("publish.before_history")
            self.history.add(fresh, events, states=self.engine.states_of(streams),
                             last_steps=self.engine.last_steps_of(streams),
                             outbound=batches, stops=list(decided.values()))
            self._forget_deferred()
            self.removed["sample_payloads_cut"] = self.history.sample_payloads_cut
            self.removed["timeline_spans_cut"] += sum(r.timelines_cut for r in fresh)
            self.events.extend(events)
            if self.otlp is not None:
                self.otlp.export(fresh)
            self.forward.observe(fresh, events)
            if now >= self._next_retention:
                self._retain(now)
        crash_point("publish.after_history")
        if batches:
            self._hand_over()
        self.goodput.wake()  # its thread accounts ready steps: never on the alerts' path
        return events

    def receive(
        self, records: Sequence[StepRecord], shard: int = 0,
        stats: AggregatorStats | None = None,
    ) -> dict[str, StopDecision]:
        """What an aggregator calls: :meth:`publish`, answered with the stop decisions of the
        published records' runs (the aggregator passes them on to the runs' Reporters)."""
        self.publish(records, shard, stats)
        return self.stops_for({r.run for r in records})

    def stops_for(self, runs: Iterable[str]) -> dict[str, StopDecision]:
        """The stop decisions of ``runs`` that the service took (run -> decision)."""
        with self._lock:
            return {run: self.stops[run] for run in runs if run in self.stops}

    def _decide_stops(self, record: StepRecord, events: list[AlertEvent], now: float,
                      decided: dict[str, StopDecision]) -> list[AlertEvent]:
        """Ask the run to stop when a rule with the stop action fires for a run the config lets
        it stop (the firing's notification says so), and renew the decision while that alert
        still holds; returns ``events`` with the stop marked."""
        if not self._stoppers:
            return events
        run = record.run
        out = []
        for event in events:
            glob = (self.settings.stop.allowed_by(run, event.alert)
                    if event.state == "firing" and event.alert in self._stoppers else None)
            if glob is not None:
                reason = summary_line(event)
                event = replace(event, stop=(
                    f"rlmon asked run {run} to stop: rule {event.alert} has the stop action and "
                    f"stop.runs {glob!r} lets it stop this run"))
                decided[run] = self._stop(StopDecision(
                    run, record.role, record.step, event.alert, reason, glob, now))
                self.stop_counts[event.alert] += 1
                _log.warning("rlmon: %s", event.stop)
            out.append(event)
        known = self.stops.get(run)
        if known is not None and known.at < now and known.alert in self._stoppers:
            state = self.engine.state(run, record.role, known.alert)
            if state is not None and state.firing and not state.false_steps:
                decided[run] = self._stop(replace(known, role=record.role, step=record.step,
                                                  at=now))
        return out

    def _with_samples(self, record: StepRecord, events: list[AlertEvent]) -> list[AlertEvent]:
        """Firings whose metric has a sample metric the step holds carry its first few items
        (payloads cut, the service's secrets masked)."""
        out = []
        for event in events:
            name = catalog.samples_for(event.metric) if event.state == "firing" else None
            items = record.samples.get(name) if name else None
            if items:
                redact = self._redactor
                event = replace(event, samples_metric=name or "", samples=tuple(
                    (s, i, redact(p)) for s, i, p in notify_items(items)))
            out.append(event)
        return out

    def _explain(self, record: StepRecord, events: list[AlertEvent]) -> list[AlertEvent]:
        """The run's framework (what to change names its keys) and what moved first."""
        framework = self._framework(record)
        out = self.first_movers.explain(events)
        return [replace(e, framework=framework) for e in out] if framework else out

    def _with_last_seen(self, record: StepRecord,
                        events: list[AlertEvent]) -> list[AlertEvent]:
        """A firing ``RankMissing`` says where the missing ranks were last heard (their stage,
        host and Ray node), where the liveness views said so."""
        seen = self._last_seen.get((record.run, record.role))
        if not seen or not any(r in seen for r in record.missing_ranks):
            return events
        return [replace(e, detail=rank_missing_detail(record, seen))
                if e.alert == "RankMissing" and e.state == "firing" else e for e in events]

    def _framework(self, record: StepRecord) -> str:
        """What the integration said (RunInfo.framework), else the prefix of a key the step
        relays (``openrlhf/...``); "" for a home-grown loop."""
        info = self.run_info.get(record.run)
        if info is not None and info.framework:
            return info.framework
        for name in record.metrics:
            prefix, sep, _ = name.partition("/")
            if sep and prefix in remedies.FRAMEWORKS:
                return prefix
        return ""

    def _stop(self, decision: StopDecision) -> StopDecision:
        self.stops.pop(decision.run, None)  # insertion order is the order of decisions
        self.stops[decision.run] = decision
        while len(self.stops) > _MAX_STOPS:
            del self.stops[next(iter(self.stops))]
        return decision

    def _hand_over(self) -> None:
        """Move the notifications the history store owes into the outbox, then wake delivery.

        Idempotent: after a crash between the two stores the outbox already holds some of them,
        and it ignores a key it holds or has delivered."""
        with self._handover_lock:
            owed = self.history.outbound()
            if not owed:
                return
            for _id, finalized_at, batch in owed:
                self.dispatcher.submit(batch, finalized_at=finalized_at, wake=False)
            crash_point("publish.after_outbox")
            self.history.handed_over(i for i, _at, _batch in owed)
        self.dispatcher.wake()

    # --- bounded state ---------------------------------------------------------------------------

    def _remember(self, stream: Stream, now: float) -> None:
        """A stream reports: bring its state back from the history store if it had left memory
        (not if it only left the tracker in this batch: its newer state is still in memory)."""
        deferred = self._deferred
        if stream not in self._tracker and (deferred is None or stream not in deferred.streams):
            run, role = stream
            restored = self.history.alert_states(run, role)
            self.engine.restore(restored, self.history.last_steps(run, role),
                                self.history.latest_attempts(run, role))
            self.costs.restore(restored)
        self._forget(self._tracker.seen(stream, now))

    def _forget_deferred(self) -> None:
        """After a batch is stored: drop what left the tracker during it (unless it came back)."""
        deferred, self._deferred = self._deferred, None
        if deferred is not None:
            self._forget(Expired([s for s in deferred.streams if s not in self._tracker],
                                 deferred.runs))

    def _forget(self, expired: Expired) -> None:
        """Drop what left memory (its alert state is in the history store). During a batch
        (``_deferred``) it only notes it: a stream crowded out by a later stream of the same
        batch must still be stored with the batch (a bound never loses what it holds)."""
        if self._deferred is not None:
            self._deferred.streams.extend(expired.streams)
            self._deferred.runs.extend(expired.runs)
            return
        self.engine.forget_streams(expired.streams)
        for run, role in expired.streams:
            self.sanity.pop((run, role), None)
            self._restored_firing.pop((run, role), None)
        for run in expired.runs:
            self.run_info.pop(run, None)
            self._relayed.pop(run, None)
        self.first_movers.forget(expired.runs)
        self.goodput.forget(expired.runs)
        self.costs.forget(expired.streams)
        self.removed["streams_forgotten"] += len(expired.streams)
        self.removed["runs_forgotten"] += len(expired.runs)

    def _retain(self, now: float) -> None:
        """Expire quiet or finished streams from memory; apply the history retention."""
        retention = self.settings.retention
        self._next_retention = now + retention.every_seconds
        self._forget(self._tracker.expire(now))
        pruned = self.history.prune(retention.history_steps,
                                    now - retention.history_days * 86_400.0,
                                    retention.timeline_steps, retention.sample_steps)
        self.removed["history_samples"] += pruned.samples
        self.removed["history_timelines"] += pruned.timelines
        self.removed["history_steps"] += pruned.steps
        self.removed["history_alerts"] += pruned.alerts
        self.removed["history_runs"] += len(pruned.runs)

    def _restored(self, record: StepRecord) -> list[AlertEvent]:
        """Alerts that were firing before a restart, shown again on the stream's first step."""
        alerts = self._restored_firing.pop((record.run, record.role), None)
        if not alerts:
            return []
        return [
            AlertEvent(record.run, record.role, record.step, alert,
                       self.engine.severity_of(alert), "firing", "", None)
            for alert in alerts if self.engine.is_firing(record.run, record.role, alert)
        ]

    def set_run_info(self, run: str, info: RunInfo | Mapping[str, Any]) -> None:
        """A run's metadata: shown as ``rlmon_run_info`` and used by the run's sanity checks."""
        meta = _run_info(info)
        with self._lock:
            self._forget(self._tracker.touch_run(run, self._clock()))
            self.run_info[run] = meta
            self.metrics.set_run_info(run, meta)
            self.forward.set_run_info(run, meta.labels(), meta.framework)
            for (r, _role), checker in self.sanity.items():
                if r == run:
                    checker.dpo, checker.deepspeed_version = self._sanity_args(meta)

    def liveness(self, views: Sequence[LivenessView], shard: int = 0) -> list[AlertEvent]:
        """An aggregator's liveness views (its timer's state changes and periodic refresh):
        shown on /metrics, turned into the time-based alerts (RunStalled, RunDied, StageStuck,
        StepTimeRegression), stored and notified like any other transition."""
        events: list[AlertEvent] = []
        batches: list[tuple[float | None, list[AlertEvent]]] = []
        with self._lock:
            now = self._clock()
            streams = set()
            changed: list[tuple[str, str, str, float, int | None, float | None, str]] = []
            seen: list[LivenessView] = []
            self._deferred = self._deferred or Expired()
            for view in views:
                stream = (view.run, view.role)
                finished = self._finished_runs.get(view.run)
                if finished is not None and view.state is not RunState.FINISHED and (
                        view.last_step_at is None or view.last_step_at <= finished):
                    view = replace(view, state=RunState.FINISHED)  # finish_run said so
                seen.append(view)
                self._remember(stream, now)
                if view.last_seen:
                    self._last_seen[stream] = {r.rank: r for r in view.last_seen}
                    while len(self._last_seen) > self.settings.retention.max_streams:
                        del self._last_seen[next(iter(self._last_seen))]
                else:  # every rank heard again: what was seen of them before is stale
                    self._last_seen.pop(stream, None)
                self.goodput.declare(view.run, view.role,
                                     view.gpus_per_rank if view.heartbeats else None, view.ranks)
                if self._live_states.get(stream) is not view.state:
                    self._live_states[stream] = view.state
                    changed.append((view.run, view.role, view.state.value, view.since,
                                    view.last_step, view.last_step_at,
                                    describe(view) if view.state is not RunState.RUNNING
                                    else ""))
                said = liveness_events(self.engine, view)
                if view.state is RunState.FINISHED:  # its alerts end with it (run_end)
                    said += close_with_run(self.engine, view.run, view.role, view.last_step,
                                           view.at)
                mine = self.costs.stamp_at(said, view.at, self.engine.all_states())
                self.metrics.set_liveness(view, liveness_firing(self.engine, *stream))
                streams.add(stream)
                if mine:
                    events.extend(mine)
                    batches.append((view.at, mine))
            if events:
                self.history.add([], events, states=self.engine.states_of(streams),
                                 outbound=batches)
                self.events.extend(events)
            self.forward.observe(events=events, views=seen)
            self._forget_deferred()
            if changed:  # for `rlmon alerts` (the state of each run, by time)
                self.history.set_liveness(changed)
                while len(self._live_states) > self.settings.retention.max_streams:
                    del self._live_states[next(iter(self._live_states))]
        if batches:
            self._hand_over()
        return events

    def finish_run(self, run: str) -> None:
        """The run ended: its series leave the exporter after the finished-run TTL."""
        with self._lock:
            self._finished_runs[run] = time.time()  # liveness views are on unix time
            while len(self._finished_runs) > _MAX_STOPS:
                del self._finished_runs[next(iter(self._finished_runs))]
            self._tracker.finish(run, self._clock())
            self.metrics.finish_run(run)
            self.goodput.finish(run)

    @staticmethod
    def _sanity_args(info: RunInfo | None) -> tuple[bool, str | None]:
        return checker_args(info)

    def _finding(self, record: StepRecord, finding: Finding) -> None:
        self.findings.append(finding)
        self.finding_counts[finding.kind.value] += 1
        log.warning("%s/%s step %s: %s: %s", record.run, record.role, record.step,
                    finding.metric, finding.message)

    def _check_sanity(self, record: StepRecord) -> None:
        checker = self.sanity.get((record.run, record.role))
        if checker is None:
            dpo, ds_version = self._sanity_args(self.run_info.get(record.run))
            checker = self.sanity[(record.run, record.role)] = SanityChecker(
                dpo=dpo, deepspeed_version=ds_version)
        for finding in checker.observe(record.step, record.metrics):
            self._finding(record, finding)
        seen = self._relayed.setdefault(record.run, set())
        fresh: dict[str, list[str]] = {}
        for name in record.metrics:
            framework, sep, key = name.partition("/")
            # only the keymaps' keys are remembered: a producer's own names cannot grow this
            if (sep and framework in keymaps.FRAMEWORKS and name not in seen
                    and keymaps.by_key(framework, key) is not None):
                seen.add(name)
                fresh.setdefault(framework, []).append(key)
        for framework, keys in sorted(fresh.items()):
            for finding in relay_warnings(framework, keys):
                self._finding(record, finding)

    def recent_events(self, since: int = 0) -> tuple[int, list[AlertEvent]]:
        """Alert events after the first ``since`` ones, and the new count (for polling)."""
        with self._lock:
            items = list(self.events)
        return len(items), items[since:]

    def close(self, timeout: float = 5.0) -> bool:
        """Deliver what the outbox holds (up to ``timeout``), stop serving, close the stores."""
        drained = self.dispatcher.shutdown(timeout)
        self.goodput.close()
        self.forward.close(timeout)
        if self.otlp is not None:
            self.otlp.close()
        if self.server is not None:
            self.server.close()
            self.server = None
        if self._web_warmer is not None:
            self._web_warmer.close()
            self._web_warmer = None
        if self._web_reader is not None:
            self._web_reader.close()
            self._web_reader = None
        self.history.close()
        return drained
