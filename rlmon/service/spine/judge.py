"""The judge: a batch of fresh steps or liveness views becomes a :class:`Verdict`.

For each step: the alert engine's transitions, priced (what the alert has cost in GPU-hours
since its onset), the stop desk's decisions, then what a responder needs in the notification
(the run's framework, what moved first, where missing ranks were last heard, sample items). For
each liveness view: the time-based alerts (RunStalled, RunDied, StageStuck, ...), priced the
same way. The judge owns the alert state; a stream that left memory comes back through
:meth:`AlertJudge.recall`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Literal

from rlmon.service.aggregation.aggregator_stats import AggregatorStats
from rlmon.service.aggregation.stream_tracker import Expired, Stream
from rlmon.service.alerting.alert_types import AlertEvent
from rlmon.service.alerting.engine import AlertEngine
from rlmon.service.alerting.first_mover import FirstMovers
from rlmon.service.alerting.liveness_alerts import liveness_events, liveness_firing
from rlmon.service.alerting.rank_missing import detail as rank_missing_detail
from rlmon.service.alerting.run_end import close_with_run
from rlmon.service.contract.run_info import RunInfo
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.contract.stop_decision import StopDecision
from rlmon.service.goodput.alert_costs import AlertCosts
from rlmon.service.goodput.ledger import GoodputLedger
from rlmon.service.liveness.run_state import LivenessView, RankSeen, RunState
from rlmon.service.metrics import catalog, remedies
from rlmon.service.metrics.rank import Rank
from rlmon.service.spine.stops import StopDesk
from rlmon.service.spine.verdict import JudgedStep, Sighting, Verdict
from rlmon.service.storage.history import HistoryStore
from rlmon.service.storage.stored_samples import notify_items

__all__ = ["AlertJudge"]


class AlertJudge:
    """Alert state, its cost and its explanation. ``run_info`` is the stream memory's registry
    (read only here); ``ledger`` hears each step before its alerts are priced (an alert's cost
    counts the GPUs of every role of the run)."""

    def __init__(
        self, engine: AlertEngine, history: HistoryStore, ledger: GoodputLedger,
        stops: StopDesk, run_info: Mapping[str, RunInfo], redact: Callable[[str], str],
        max_streams: int,
    ) -> None:
        self.engine, self.stops, self._ledger = engine, stops, ledger
        self._history, self._run_info, self._redact = history, run_info, redact
        self._max_streams = max_streams
        self.costs = AlertCosts(ledger.price, ledger.run_gpus)
        # the related metrics' recent values per run: what moved first before a firing
        self.first_movers = FirstMovers()
        # per stream, where its silent or ended ranks were last heard (RankMissing names it)
        self._last_seen: dict[Stream, dict[Rank, RankSeen]] = {}
        # A restarted service continues every (run, role, alert) where it stopped: a firing
        # alert still resolves, a pending one still needs only its remaining bad steps, and
        # alerts firing across a restart keep counting their cost.
        restored = history.alert_states()
        engine.restore(restored, history.last_steps(), history.latest_attempts())
        self.costs.restore(restored)
        self._restored_firing: dict[Stream, list[str]] = {}
        for (run, role, alert), st in restored.items():
            if st.firing:
                self._restored_firing.setdefault((run, role), []).append(alert)

    def recall(self, stream: Stream) -> None:
        """Bring a stream's alert state back from the history store (it left memory)."""
        run, role = stream
        restored = self._history.alert_states(run, role)
        self.engine.restore(restored, self._history.last_steps(run, role),
                            self._history.latest_attempts(run, role))
        self.costs.restore(restored)

    def judge(
        self, kind: Literal["steps", "liveness"], records: Sequence[StepRecord],
        views: Sequence[LivenessView], now: float, shard: int = 0,
        stats: AggregatorStats | None = None,
    ) -> Verdict:
        for record in records:  # first: an alert's cost counts the GPUs of every role
            self._ledger.add(record)
        decided: dict[str, StopDecision] = {}
        steps = tuple(self._step(record, now, decided) for record in records)
        sightings = tuple(self._sight(view) for view in views)
        if kind == "steps":  # what the commit stores beside the steps
            streams = list(dict.fromkeys((s.record.run, s.record.role) for s in steps))
            return Verdict(kind, now, shard, stats, steps, stops=tuple(decided.values()),
                           states=self.engine.states_of(streams),
                           last_steps=self.engine.last_steps_of(streams))
        if not any(s.events for s in sightings):  # views that changed no alert store none
            return Verdict(kind, now, shard, sightings=sightings)
        streams = list(dict.fromkeys((s.view.run, s.view.role) for s in sightings))
        return Verdict(kind, now, shard, sightings=sightings,
                       states=self.engine.states_of(streams))

    def _step(self, record: StepRecord, now: float,
              decided: dict[str, StopDecision]) -> JudgedStep:
        self.first_movers.observe(record)
        engine = self.engine
        events = self.costs.stamp(record, engine.evaluate(record), [
            (alert, st) for (_r, _o, alert), st
            in engine.stream_states(record.run, record.role).items()])
        events = self.stops.decide(record, events, now, decided)
        if events:
            events = self._explain(record, events)
        if record.samples:
            events = self._with_samples(record, events)
        return JudgedStep(record, tuple(events), tuple(self._restored(record)))

    def _sight(self, view: LivenessView) -> Sighting:
        stream = (view.run, view.role)
        if view.last_seen:
            self._last_seen[stream] = {r.rank: r for r in view.last_seen}
            while len(self._last_seen) > self._max_streams:
                del self._last_seen[next(iter(self._last_seen))]
        else:  # every rank heard again: what was seen of them before is stale
            self._last_seen.pop(stream, None)
        self._ledger.declare(view.run, view.role,
                             view.gpus_per_rank if view.heartbeats else None, view.ranks)
        said = liveness_events(self.engine, view)
        if view.state is RunState.FINISHED:  # its alerts end with it (run_end)
            said += close_with_run(self.engine, view.run, view.role, view.last_step, view.at)
        events = self.costs.stamp_at(said, view.at, self.engine.all_states())
        return Sighting(view, tuple(events), liveness_firing(self.engine, *stream))

    def _explain(self, record: StepRecord, events: list[AlertEvent]) -> list[AlertEvent]:
        """The run's framework (what to change names its keys), what moved first, and for a
        firing ``RankMissing`` where the missing ranks were last heard (their stage, host and
        Ray node), where the liveness views said so."""
        framework = self._framework(record)
        events = self.first_movers.explain(events)
        if framework:
            events = [replace(e, framework=framework) for e in events]
        seen = self._last_seen.get((record.run, record.role))
        if not seen or not any(r in seen for r in record.missing_ranks):
            return events
        return [replace(e, detail=rank_missing_detail(record, seen))
                if e.alert == "RankMissing" and e.state == "firing" else e for e in events]

    def _with_samples(self, record: StepRecord, events: list[AlertEvent]) -> list[AlertEvent]:
        """Firings whose metric has a sample metric the step holds carry its first few items
        (payloads cut, the service's secrets masked)."""
        out = []
        for event in events:
            name = catalog.samples_for(event.metric) if event.state == "firing" else None
            items = record.samples.get(name) if name else None
            if items:
                redact = self._redact
                event = replace(event, samples_metric=name or "", samples=tuple(
                    (s, i, redact(p)) for s, i, p in notify_items(items)))
            out.append(event)
        return out

    def _framework(self, record: StepRecord) -> str:
        """What the integration said (RunInfo.framework), else the prefix of a key the step
        relays (``openrlhf/...``); "" for a home-grown loop."""
        info = self._run_info.get(record.run)
        if info is not None and info.framework:
            return info.framework
        for name in record.metrics:
            prefix, sep, _ = name.partition("/")
            if sep and prefix in remedies.FRAMEWORKS:
                return prefix
        return ""

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

    def forget(self, expired: Expired) -> None:
        """Drop what left memory (its alert state is in the history store)."""
        self.engine.forget_streams(expired.streams)
        for stream in expired.streams:
            self._restored_firing.pop(stream, None)
        self.first_movers.forget(expired.runs)
        self.costs.forget(expired.streams)
