"""Each alert transition carries what its condition has cost so far.

The onset of a condition is the start of the first step at which it held (a ``for 3`` rule fires
at its third bad step, and the two before were paid for too): the earliest start among the
step's rank timelines, else the end of the stream's previous step, else the step's own
finalization. A firing says the cost from onset to its step; the resolve says it again from the
same onset to the step that resolved it (the incident's whole cost). A time-based (liveness)
alert's onset comes on its firing event (the last step before a stall, the entry into a stuck
stage) and its cost runs to the view's time.

The onset and the run's GPUs at onset are mirrored onto the alert's
:class:`~rlmon.service.alerting.engine.AlertState`, which the history store saves with every
transition: a restarted service restores them (:meth:`AlertCosts.restore`) and an alert
firing across the restart still costs its whole span on resolve.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace

from rlmon.service.alerting.engine import AlertEvent, AlertState
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.goodput.cost import Price, alert_cost

__all__ = ["AlertCosts"]

_MAX_ONSETS = 100_000  # (run, role, alert) onsets kept; the oldest leave first


class AlertCosts:
    """Onsets per (run, role, alert), and the cost stamped on each transition."""

    def __init__(self, price: Price, gpus: Callable[[str], float]) -> None:
        self.price = price
        self._gpus = gpus
        self._onsets: dict[tuple[str, str, str], float] = {}
        self._held: dict[tuple[str, str, str], float] = {}  # the run's GPUs at onset
        self._previous_end: dict[tuple[str, str], float] = {}
        self._firing: set[tuple[str, str, str]] = set()  # stamped firing, not yet resolved

    def _start(self, record: StepRecord) -> float | None:
        if record.timelines:
            return min(t.timeline.start_ns for t in record.timelines) * 1e-9
        return self._previous_end.get((record.run, record.role), record.finalized_at)

    def _begin(self, key: tuple[str, str, str], onset: float, state: AlertState) -> None:
        self._onsets[key] = onset
        gpus = self._gpus(key[0])
        self._held[key] = gpus
        state.onset, state.gpus = onset, gpus

    def _run_gpus(self, key: tuple[str, str, str]) -> float:
        """The run's GPUs now (the goodput ledger's), else those it held at onset (a restarted
        service that has not yet heard the run's ranks)."""
        gpus = self._gpus(key[0])
        return gpus if gpus > 0 else self._held.get(key, 0.0)

    def _drop(self, key: tuple[str, str, str], state: AlertState | None) -> None:
        self._onsets.pop(key, None)
        self._held.pop(key, None)
        self._firing.discard(key)
        if state is not None:
            state.onset, state.gpus = None, 0.0

    def _priced(self, events: Sequence[AlertEvent], now: float | None,
                states: Mapping[str, AlertState]) -> list[AlertEvent]:
        out = []
        for event in events:
            key = (event.run, event.role, event.alert)
            onset = self._onsets.get(key)
            if onset is not None and now is not None:
                cost = alert_cost(onset, now, self._run_gpus(key), self.price)
                event = replace(event, onset=onset, gpus=cost.gpus, gpu_hours=cost.gpu_hours,
                                money=cost.money, cost_note=cost.describe(event.state))
            if event.state == "resolved":
                self._drop(key, states.get(event.alert))
            elif onset is not None:
                self._firing.add(key)
            out.append(event)
        return out

    def stamp(self, record: StepRecord, events: Sequence[AlertEvent],
              states: Iterable[tuple[str, AlertState]]) -> list[AlertEvent]:
        """Note the onsets ``record`` starts (``states``: (alert, state) of its stream after
        evaluation) and return ``events`` with their cost."""
        run, role = record.run, record.role
        start = self._start(record)
        by_alert = dict(states)
        for alert, state in by_alert.items():
            key = (run, role, alert)
            if state.true_steps == 1 and key not in self._onsets and start is not None:
                self._begin(key, start, state)  # the condition began holding at this step
        now = record.finalized_at
        out = self._priced(events, now, by_alert)
        for alert, state in by_alert.items():
            if state.true_steps == 0 and not state.firing:
                self._drop((run, role, alert), state)
        if now is not None:
            self._previous_end[(run, role)] = now
        self._bound()
        return out

    def stamp_at(self, events: Sequence[AlertEvent], now: float,
                 states: Mapping[tuple[str, str, str], AlertState]) -> list[AlertEvent]:
        """Time-based transitions at ``now`` (unix seconds): a firing event's ``onset`` begins
        its condition (kept if a restart restored an earlier one); the cost runs to ``now``."""
        for event in events:
            key = (event.run, event.role, event.alert)
            state = states.get(key)
            if (event.state == "firing" and event.onset is not None and key not in self._onsets
                    and state is not None):
                self._begin(key, event.onset, state)
        out = []
        for event in events:
            key = (event.run, event.role, event.alert)
            state = states.get(key)
            out.extend(self._priced([event], now, {event.alert: state} if state else {}))
        self._bound()
        return out

    def restore(self, states: Mapping[tuple[str, str, str], AlertState]) -> None:
        """Onsets saved with the alert states (a restarted service, a stream back in memory)."""
        for key, state in states.items():
            if state.onset is None or (not state.firing and state.true_steps == 0):
                continue
            self._onsets[key] = state.onset
            self._held[key] = state.gpus
            if state.firing:
                self._firing.add(key)

    def _bound(self) -> None:
        while len(self._onsets) > _MAX_ONSETS:
            oldest = next(iter(self._onsets))
            self._drop(oldest, None)
        while len(self._previous_end) > _MAX_ONSETS:
            del self._previous_end[next(iter(self._previous_end))]

    def firing(self, now: float) -> dict[tuple[str, str, str], float]:
        """(run, role, alert) -> GPU-hours each alert firing now has cost since its onset."""
        return {key: alert_cost(self._onsets[key], now, self._run_gpus(key), self.price).gpu_hours
                for key in list(self._firing) if key in self._onsets}

    def forget(self, streams: Iterable[tuple[str, str]]) -> None:
        for run, role in streams:
            self._previous_end.pop((run, role), None)
            for key in [k for k in self._onsets if k[:2] == (run, role)]:
                self._drop(key, None)
