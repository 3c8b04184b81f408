"""The service: exporter HTTP server, alert engine with its notifiers, and the history store.

:class:`ServiceCore` is plain Python (tests drive it in-process);
:mod:`rlmon.actors.service_actor` wraps it as the named Ray actor that aggregators publish
finalized steps to. The core wires the stages of the spine (:mod:`rlmon.service.spine`) and
owns their lifecycle; a batch of steps (:meth:`ServiceCore.publish`) or of liveness views
(:meth:`ServiceCore.liveness`) walks the same line of stages (docs/design.md, "The spine").

Publishing is idempotent: a step the history store already holds (a redelivery after an
aggregator restart) is ignored, so it is neither exported, evaluated nor notified twice. A step,
its alert transitions and the notifications they owe are one commit of the history store; the
notifications then move to the outbox (:mod:`rlmon.service.spine.commit`). What the service keeps
is bounded (config ``retention``; :mod:`rlmon.service.spine.memory`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from rlmon.service.aggregation.aggregator_stats import AggregatorStats
from rlmon.service.alerting.alert_types import AlertEvent
from rlmon.service.alerting.engine import AlertEngine
from rlmon.service.alerting.notify.factory import build_dispatcher, open_outbox, outbox_path
from rlmon.service.alerting.rules import Rule, default_rules, unknown_metrics
from rlmon.service.config import Settings, load_config
from rlmon.service.contract.run_info import RunInfo
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.contract.stop_decision import StopDecision
from rlmon.service.export.exporter import MetricsState
from rlmon.service.forward.sink import ForwardSink
from rlmon.service.goodput.ledger import GoodputLedger
from rlmon.service.liveness.run_state import LivenessView
from rlmon.service.redact import install_redaction
from rlmon.service.spine.commit import Commit
from rlmon.service.spine.judge import AlertJudge
from rlmon.service.spine.line import Spine
from rlmon.service.spine.memory import StreamMemory
from rlmon.service.spine.ports import ServicePorts
from rlmon.service.spine.sink import Sinks, StepSink
from rlmon.service.spine.sinks import ExporterSink, GoodputSink, OtlpSink, SanitySink
from rlmon.service.spine.stops import StopDesk
from rlmon.service.storage.history import HistoryStore

__all__ = ["ServiceCore"]

_log = logging.getLogger("rlmon.service")


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
        sinks: Sequence[StepSink] = (),
    ) -> None:
        """Builds the core and starts no thread: :meth:`start` starts them, the HTTP server
        among them. ``port`` None: no HTTP server; with ``port_fallback`` a taken port gives way
        to a free one (the embedded default), otherwise :meth:`start` raises. ``clock`` (unix
        seconds) drives expiry and retention (tests inject a simulated one). ``sinks``: outputs
        of one's own (:class:`~rlmon.service.spine.sink.StepSink`), after the built-in ones;
        they hear every verdict and are started and closed with the service."""
        settings = self.settings = settings or load_config()
        self._clock = clock or time.time
        self._lock = threading.Lock()
        self._started = False
        state = Path(state_dir) if state_dir is not None else None
        if state is not None:
            state.mkdir(parents=True, exist_ok=True)
        history = self.history = HistoryStore(
            state / "history.sqlite" if state else ":memory:",
            sample_payload_bytes=settings.retention.sample_payload_bytes)
        engine = AlertEngine(list(rules) if rules is not None else default_rules())
        for warning in unknown_metrics(engine.rules) if rules is not None else ():
            _log.warning("rlmon: %s", warning)
        self.dispatcher = build_dispatcher(
            settings, open_outbox(settings, outbox_path(settings, state)), transports=transports,
            state_dir=state.resolve() if state else None)
        # after the notifier modules (and their clients' loggers) exist
        install_redaction(settings.secret_values())
        exp, retention = settings.exporter, settings.retention
        metrics = self.metrics = MetricsState(
            max_series=exp.max_series, run_ttl=exp.run_ttl_seconds,
            finished_ttl=exp.finished_run_ttl_seconds, redactor=settings.redactor(),
            clock=clock)
        # where the GPU-hours go (goodput by bucket) and what each alert has cost since onset
        ledger = self.goodput = GoodputLedger(settings.goodput)
        if settings.liveness.gpus_per_rank != 1.0:
            _log.warning("rlmon: liveness.gpus_per_rank is no longer read: a stall costs what "
                         "every alert costs, with goodput.gpus_per_rank (docs/goodput.md)")
        run_info: dict[str, RunInfo] = {}  # the stream memory's registry, shared read-only
        stops = StopDesk(engine, settings.stop, history)
        judge = AlertJudge(engine, history, ledger, stops, run_info, settings.redactor(),
                           retention.max_streams)
        forward = ForwardSink(settings.forward)  # its threads start with start()
        sanity, exporter = SanitySink(run_info), ExporterSink(metrics)
        outputs = Sinks([exporter, sanity, OtlpSink(settings.otlp), forward, GoodputSink(ledger),
                         *sinks])
        memory = StreamMemory(retention, history, self._clock(), judge.recall, [judge, outputs],
                              run_info, restored=engine.streams())
        commit = Commit(history, self.dispatcher, retention.max_streams)
        self.spine = Spine(memory, judge, commit, outputs, self._clock)
        # what /metrics reads at scrape time
        metrics.dispatch = self.dispatcher.stats
        metrics.goodput = ledger.snapshot
        metrics.goodput_rolled_back = ledger.rolled_back
        metrics.alert_costs = lambda: judge.costs.firing(self._clock())
        metrics.sanity = lambda: dict(sanity.counts)
        metrics.stops = lambda: dict(stops.counts)
        metrics.ingest = exporter.aggregated
        metrics.redelivered = lambda: memory.redeliveries
        metrics.removed = lambda: {**memory.counts(), **forward.removed(), **exporter.removed()}
        self.ports = ServicePorts(settings, state, port, host, port_fallback, history=history,
                                  metrics=metrics, rules=engine.rules, ledger=ledger,
                                  run_info=run_info, health=commit.healthy)

    def start(self) -> ServiceCore:
        """Start the threads beside the alert path: the notifiers' deliveries, the sinks'
        (goodput accounting, OTLP span export, forwarding) and, with a ``port``, the /metrics
        and run-page server with its cache warmer. The service actor and ``rlmon serve`` call
        it once the core is built; a test that drives the core on its own thread does not
        (delivery then waits for ``dispatcher.drain`` or :meth:`close`, and the ledger accounts
        as it is woken). Returns the core."""
        if self._started:
            return self
        self._started = True
        self.dispatcher.start()
        self.spine.sinks.start()
        try:
            self.ports.start()
        except OSError:
            self.close(0.0)
            raise
        return self

    @property
    def port(self) -> int | None:
        return self.ports.port

    def publish(
        self, records: Sequence[StepRecord], shard: int = 0,
        stats: AggregatorStats | None = None,
    ) -> list[AlertEvent]:
        """Export, evaluate, store and notify finalized steps; returns the alert transitions."""
        if stats is not None and not isinstance(stats, AggregatorStats):
            raise TypeError(f"stats must be an AggregatorStats, got {type(stats).__name__}")
        return self._carry("steps", records, (), shard, stats)

    def liveness(self, views: Sequence[LivenessView], shard: int = 0) -> list[AlertEvent]:
        """An aggregator's liveness views (its timer's state changes and periodic refresh):
        shown on /metrics, turned into the time-based alerts (RunStalled, RunDied, StageStuck,
        StepTimeRegression), stored and notified like any other transition."""
        return self._carry("liveness", (), views, shard, None)

    def _carry(self, kind: Literal["steps", "liveness"], records: Sequence[StepRecord],
               views: Sequence[LivenessView], shard: int,
               stats: AggregatorStats | None) -> list[AlertEvent]:
        """The one routine of both: the batch walks the spine under the lock; its
        notifications are handed over after it (latency counts from the step's finalization)."""
        with self._lock:
            verdict = self.spine.carry(kind, records, views, shard, stats)
        return self.spine.deliver(verdict)

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
            return self.spine.stops.for_runs(runs)

    def set_run_info(self, run: str, info: RunInfo | Mapping[str, Any]) -> None:
        """A run's metadata: shown as ``rlmon_run_info`` and used by the run's sanity checks."""
        meta = info if isinstance(info, RunInfo) else RunInfo.from_fields(info)
        with self._lock:
            self.spine.memory.remember_run(run, meta, self._clock())
            self.spine.sinks.run_info(run, meta)
            self.history.set_run_info(run, meta.labels(), time.time())

    def finish_run(self, run: str) -> None:
        """The run ended: its series leave the exporter after the finished-run TTL, the ledger
        accounts every step it still holds."""
        with self._lock:
            self.spine.memory.finish(run, self._clock())
            self.spine.sinks.finish_run(run)

    def recent_events(self, since: int = 0) -> tuple[int, list[AlertEvent]]:
        """Alert events after the first ``since`` ones, and the new count (for polling)."""
        with self._lock:
            items = list(self.spine.commit.events)
        return len(items), items[since:]

    def close(self, timeout: float = 5.0) -> bool:
        """Deliver what the outbox holds (up to ``timeout``), stop the sinks and serving, close
        the stores."""
        drained = self.dispatcher.shutdown(timeout)
        self.spine.sinks.close(timeout)
        self.ports.close()
        self.history.close()
        return drained
