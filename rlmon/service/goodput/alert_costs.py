"""Each alert transition carries what its condition has cost so far.

The onset of a condition is the start of the first step at which it held (a ``for 3`` rule fires
at its third bad step, and the two before were paid for too): the earliest start among the
step's rank timelines, else the end of the stream's previous step, else the step's own
finalization. A firing says the cost from onset to its step; the resolve says it again from the
same onset to the step that resolved it (the incident's whole cost). An alert that was firing
before a service restart has no onset in memory: its events carry no cost.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
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
        self._previous_end: dict[tuple[str, str], float] = {}
        self._firing: set[tuple[str, str, str]] = set()  # stamped firing, not yet resolved

    def _start(self, record: StepRecord) -> float | None:
        if record.timelines:
            return min(t.timeline.start_ns for t in record.timelines) * 1e-9
        return self._previous_end.get((record.run, record.role), record.finalized_at)

    def stamp(self, record: StepRecord, events: Sequence[AlertEvent],
              states: Iterable[tuple[str, AlertState]]) -> list[AlertEvent]:
        """Note the onsets ``record`` starts (``states``: (alert, state) of its stream after
        evaluation) and return ``events`` with their cost."""
        run, role = record.run, record.role
        start = self._start(record)
        states = list(states)
        for alert, state in states:
            key = (run, role, alert)
            if state.true_steps == 1 and key not in self._onsets and start is not None:
                self._onsets[key] = start  # the condition began holding at this step
        out = []
        now = record.finalized_at
        for event in events:
            key = (run, role, event.alert)
            onset = self._onsets.get(key)
            if onset is not None and now is not None:
                cost = alert_cost(onset, now, self._gpus(run), self.price)
                event = replace(event, onset=onset, gpus=cost.gpus, gpu_hours=cost.gpu_hours,
                                money=cost.money, cost_note=cost.describe(event.state))
            if event.state == "resolved":
                self._onsets.pop(key, None)
                self._firing.discard(key)
            elif onset is not None:
                self._firing.add(key)
            out.append(event)
        for alert, state in states:
            if state.true_steps == 0 and not state.firing:
                self._onsets.pop((run, role, alert), None)
        if now is not None:
            self._previous_end[(run, role)] = now
        while len(self._onsets) > _MAX_ONSETS:
            oldest = next(iter(self._onsets))
            del self._onsets[oldest]
            self._firing.discard(oldest)
        while len(self._previous_end) > _MAX_ONSETS:
            del self._previous_end[next(iter(self._previous_end))]
        return out

    def firing(self, now: float) -> dict[tuple[str, str, str], float]:
        """(run, role, alert) -> GPU-hours each alert firing now has cost since its onset."""
        return {key: alert_cost(self._onsets[key], now, self._gpus(key[0]), self.price).gpu_hours
                for key in list(self._firing) if key in self._onsets}

    def forget(self, streams: Iterable[tuple[str, str]]) -> None:
        for run, role in streams:
            self._previous_end.pop((run, role), None)
            for key in [k for k in self._onsets if k[:2] == (run, role)]:
                del self._onsets[key]
                self._firing.discard(key)
