"""The commit: a verdict's steps, alert transitions, the alert state after them, the stop
decisions and the notifications they owe are one transaction of the history store; the
notifications then move to the outbox of the notifiers' dispatcher, and whatever a crash left
between the two stores moves on the next start (see :mod:`rlmon.service.crash_points` for the
commit points a test kills the process at)."""

from __future__ import annotations

import threading
from collections import deque

from rlmon.service.alerting.alert_types import AlertEvent
from rlmon.service.alerting.notify.dispatcher import Dispatcher
from rlmon.service.crash_points import crash_point
from rlmon.service.liveness.run_state import RunState, describe
from rlmon.service.spine.verdict import Stream, Verdict
from rlmon.service.storage.history import HistoryStore

__all__ = ["Commit"]

_RECENT_EVENTS = 10_000  # transitions kept in memory for polling (all are in the history store)


class Commit:
    """Stores verdicts and hands their notifications over; ``events`` holds the newest
    transitions (``rlmon alerts --follow`` polls them)."""

    def __init__(self, history: HistoryStore, dispatcher: Dispatcher, max_streams: int) -> None:
        self.history, self.dispatcher = history, dispatcher
        self._max_streams = max_streams
        self.events: deque[AlertEvent] = deque(maxlen=_RECENT_EVENTS)
        self._live_states: dict[Stream, RunState] = {}  # last stored, per stream
        self._handover_lock = threading.Lock()
        self.hand_over()  # what a crash left between the history store and the outbox

    def store(self, verdict: Verdict) -> None:
        """One transaction (a batch of steps always; liveness views when they made
        transitions), then the runs' liveness states that changed (``rlmon alerts``)."""
        events = verdict.events
        if verdict.kind == "steps":
            crash_point("publish.before_history")
            self.history.add(verdict.records, events, states=verdict.states,
                             last_steps=verdict.last_steps, outbound=verdict.outbound,
                             stops=verdict.stops)
        elif events:
            self.history.add([], events, states=verdict.states, outbound=verdict.outbound)
        self.events.extend(events)
        changed = []
        for view in verdict.views:
            stream = (view.run, view.role)
            if self._live_states.get(stream) is not view.state:
                self._live_states[stream] = view.state
                changed.append((view.run, view.role, view.state.value, view.since,
                                view.last_step, view.last_step_at,
                                describe(view) if view.state is not RunState.RUNNING else ""))
        if changed:
            self.history.set_liveness(changed)
            while len(self._live_states) > self._max_streams:
                del self._live_states[next(iter(self._live_states))]

    def deliver(self, verdict: Verdict) -> None:
        """After the service's lock: the stored notifications go to the outbox."""
        if verdict.kind == "steps":
            crash_point("publish.after_history")
        if verdict.outbound:
            self.hand_over()

    def hand_over(self) -> None:
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

    def healthy(self) -> tuple[bool, str]:
        """(ok, reason) for ``/healthz``: unhealthy when alerts could no longer be delivered or
        stored (a delivery thread died, the history store is closed)."""
        dead = self.dispatcher.dead_threads()
        if dead:
            return False, f"delivery thread(s) not running: {', '.join(dead)}"
        if self.history.closed:
            return False, "history store closed"
        return True, "ok"
