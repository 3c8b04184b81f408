"""The aggregator's liveness desk: heartbeats in, the timer that judges each stream's state on
the wall clock, the views due to the service, and what a restart needs to continue.

The wall clock (not a monotonic one) because the state survives a restart: who was heard when,
the step periods, the states (a stall is neither forgotten nor paged again after a restart) and
the deadline policy's view of each rank. :class:`~rlmon.service.aggregation.aggregator.
AggregatorCore` holds one and calls it under its lock.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlmon.service.aggregation.deadline import DeadlinePolicy
from rlmon.service.aggregation.watermark import WatermarkStore
from rlmon.service.clock import Clock
from rlmon.service.contract.heartbeat import Heartbeat, check_heartbeat
from rlmon.service.contract.records import ContractError
from rlmon.service.liveness.run_state import LivenessTracker, LivenessView
from rlmon.service.liveness.thresholds import LivenessParams

__all__ = ["LivenessDesk"]

Stream = tuple[str, str]


class LivenessDesk:
    """Liveness of the aggregator's streams: judged by :meth:`tick`, kept for the service until
    it takes the views, persisted in the watermark store every heartbeat period."""

    def __init__(self, params: LivenessParams | None, deadline: DeadlinePolicy, *,
                 now: Clock, wall: Clock, store: WatermarkStore | None) -> None:
        self.tracker = LivenessTracker(params)
        self.deadline = deadline
        self._now, self._wall, self.store = now, wall, store
        self._views: dict[Stream, LivenessView] = {}
        self._next_evaluation = 0.0
        self._next_refresh = 0.0
        self._gone: list[Stream] = []  # streams that left memory: removed from the store next save
        self.heartbeats_refused = 0

    def checked(self, beat: Heartbeat) -> Heartbeat:
        """The heartbeat, checked; a bad one is counted and raises :class:`ContractError`."""
        try:
            return check_heartbeat(beat)
        except ContractError:
            self.heartbeats_refused += 1
            raise

    def forget(self, stream: Stream) -> None:
        """The stream left the aggregator's memory: it leaves the tracker, and the store."""
        if stream in self.tracker:
            self.tracker.forget(*stream)
            self._gone.append(stream)

    def tick(self, now: bool = False) -> None:
        """The timer: re-evaluate every stream's state; keep what changed (and, every
        heartbeat period, every view) for the service; persist what a restart needs. ``now``:
        whether or not the timer is due (the aggregator's close)."""
        wall = self._wall()
        if wall < self._next_evaluation and not now:
            return
        params = self.tracker.params
        self._next_evaluation = wall + params.evaluate_seconds
        for view in self.tracker.evaluate(wall):
            self._views[(view.run, view.role)] = view
        if wall >= self._next_refresh:
            self._next_refresh = wall + params.heartbeat_seconds
            for view in self.tracker.views(wall):
                self._views[(view.run, view.role)] = view
            if self.store is not None:
                gone, self._gone = self._gone, []
                self.store.save_liveness(self.saved_state(wall), gone)

    def saved_state(self, wall: float) -> dict[Stream, dict[str, Any]]:
        """Per stream, the tracker's knowledge and the deadline's view of its ranks."""
        now = self._now()
        out = {}
        for stream, data in self.tracker.dump().items():
            data["deadline"] = self.deadline.dump(*stream, now=now, wall=wall)
            out[stream] = data
        return out

    def restore(self, seen: Callable[[Stream], None]) -> None:
        """Continue from the last saved liveness, so a step does not wait the start-up deadline
        for a rank known to be dead. ``seen`` is told each saved stream before the deadline
        policy's view of it is loaded: they age from now, and leave memory (and the store) as
        others."""
        if self.store is None:
            return
        saved = self.store.load_liveness()
        self.tracker.load(saved)
        now, wall = self._now(), self._wall()
        for stream in saved:
            seen(stream)
        for (run, role), data in saved.items():
            deadline = data.get("deadline")
            if isinstance(deadline, dict):
                self.deadline.load(run, role, deadline, now=now, wall=wall)

    def take_views(self) -> list[LivenessView]:
        """The views due to the service (changed, or the periodic refresh)."""
        views, self._views = list(self._views.values()), {}
        return views

    def give_back_views(self, views: list[LivenessView]) -> None:
        """Views the service did not take (it was restarting): sent again, unless newer."""
        for view in views:
            self._views.setdefault((view.run, view.role), view)
