"""The delivery protocol of a Reporter's step messages, run on its sender thread.

* Closed steps queue, then are packed (by the packer this is given) and sent in order, at most
  ``max_batch`` a call. Each message gets the next sequence number, so the aggregator knows a
  resend for a duplicate; ``started`` (when the Reporter was created) tells a rerun of the run
  from a late resend.
* A send that raises keeps the batch and retries it, backing off from 0.05 s to 2 s. Closed and
  packed steps together stay within ``max_pending``; beyond it the oldest is dropped, counted in
  ``dropped`` and that count travels in every later message.
* An acknowledgement naming the aggregator's incarnation and its per-stream floors makes the
  acknowledged messages of steps not yet final retained; when the incarnation changes (the
  aggregator restarted and lost its open steps) they are sent again, marked ``resend``. While
  messages are retained the aggregator is probed every half second, so a restart is noticed
  with nothing new to send; ``flush`` waits for one fresh answer.
* A sink that raises :class:`~rlmon.actors.reporter.sink.SinkClosed` (Ray is gone for good)
  ends the protocol: everything held counts as dropped, said once in the log.
* Acknowledgements also carry what the aggregator refused (counted in ``refused_messages``) and
  the service's stop decision for the run.

Nothing here waits on the training thread: it only appends to the queue (:meth:`put`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Generic, Protocol, TypeVar

from rlmon.actors.reporter.sink import ReportSink, SinkClosed
from rlmon.actors.reporter.tally import Tally
from rlmon.service.contract.heartbeat import Heartbeat
from rlmon.service.contract.step_message import StepMessage
from rlmon.service.contract.stop_decision import StopDecision
from rlmon.service.liveness.thresholds import LivenessParams

__all__ = ["Delivery", "Stamp"]

log = logging.getLogger(__name__)

HEARTBEAT_S = LivenessParams().heartbeat_seconds  # until the service tells its own
PROBE_S = 0.5  # how often a reporter holding retained messages asks the aggregator who it is
_PROBE_RETRY_S = 0.2  # after a probe that failed
_CLOSING_SHARE_S = 0.5  # of a close's timeout, kept for the closing heartbeat
_BACKOFF_S = (0.05, 2.0)  # a failed send is retried after the first, doubling up to the second


def _no_reason() -> str | None:
    return None


class _Stepped(Protocol):
    @property
    def step(self) -> int: ...


Raw = TypeVar("Raw", bound=_Stepped)


@dataclass(frozen=True, slots=True)
class Stamp:
    """What the delivery protocol writes into a message as it is packed."""

    seq: int  # increases per message of one reporter: a resend is known as a duplicate
    dropped: int  # messages given up on so far
    started: float  # when the reporter was created (unix seconds)


class _Probes:
    """Incarnation probes: when the next is due; ``flush`` asks for one and waits until one
    that started after it asked has answered."""

    __slots__ = ("asked", "done", "next_at")

    def __init__(self) -> None:
        self.next_at = 0.0  # monotonic time of the next probe (while messages are retained)
        self.asked = 0
        self.done = 0


class Delivery(Generic[Raw]):
    """Sends what :meth:`put` queues, packed by ``pack``, to ``sink`` on a thread of its own.

    ``run`` and ``role`` name the stream (its floor in an ack, its stop decision, the log).
    """

    def __init__(
        self,
        sink: ReportSink,
        pack: Callable[[Raw, Stamp], StepMessage],
        tally: Tally,
        *,
        run: str,
        role: str,
        started: float,
        max_pending: int = 1024,
        max_batch: int = 64,
        heartbeat: Callable[[bool], Heartbeat] | None = None,
        heartbeat_s: float | None = HEARTBEAT_S,
    ) -> None:
        self.sink = sink
        # Liveness (docs/liveness.md): every heartbeat_s this thread says the rank is alive and
        # where it is, riding on the step messages it sends or alone when it has none; from the
        # first send or the first span, whichever comes first (a Reporter that has neither sent
        # a step nor entered a stage starts no Ray for a heartbeat; one that entered a stage
        # before its first step, a cold load or the first weight sync, is watched from there)
        # heartbeat_s None: the period the service judges silence by, as the sink tells it
        # once connected (``heartbeat_seconds``), the default until then
        self.heartbeat = heartbeat
        self.heartbeat_s = heartbeat_s if heartbeat_s is not None else HEARTBEAT_S
        self._period_told = heartbeat_s is not None
        self._next_beat = 0.0
        self._in_a_stage = False
        self._said_closing = False  # no heartbeat may follow the closing one
        # The closing heartbeat is sent from its own thread (bounded at exit) while the sender
        # thread may be inside a regular beat: one at a time, and none once closing was said,
        # or a late regular beat would read as the rank coming back after its end
        self._beat_lock = threading.Lock()
        self.heartbeats = 0
        self._beats_asked = self._beats_built = 0  # beat_now's requests, and those answered
        self.pack = pack
        self.tally = tally
        self.run, self.role = run, role
        self.started = started
        self.max_pending, self.max_batch = max_pending, max_batch
        self.dropped = 0
        self.sent = 0
        self.resent = 0
        self.refused_messages = 0  # step messages the aggregator refused (its reason: last_error)
        # The service's latest stop decision for this run, from an ack: written on the sender
        # thread, read on the training thread.
        self.stop_decision: StopDecision | None = None
        self._cond = threading.Condition()
        self._raw: deque[Raw] = deque()  # not packed
        self._packing = 0  # taken from _raw, not yet in _pending
        self._pending: deque[StepMessage] = deque()  # packed, sent or not, not acknowledged
        self._retained: deque[StepMessage] = deque()  # acknowledged, step not finalized yet
        self._seq = 0
        self._incarnation: str | None = None
        self._probes = _Probes()
        self._closed = False
        self._calling = False  # the sender thread is inside a call to the sink
        self._gone = False  # the sink said Ray is gone for good: nothing more can be sent
        self._closed_whole = False  # closed with every message acknowledged
        self._thread = threading.Thread(target=self._send_loop, name="rlmon-reporter", daemon=True)
        self._thread.start()

    # -- the training thread's side -------------------------------------------------------------

    def put(self, raw: Raw) -> None:
        """Queue a closed step; returns at once (the oldest is dropped beyond the bound)."""
        with self._cond:
            self._raw.append(raw)
            self._trim()
            self._cond.notify()

    def beat_now(self, wait: float = 0.0) -> bool:
        """Send a heartbeat at once (something worth saying happened), waiting up to ``wait``
        seconds for it to leave; True when it did (or no wait was asked)."""
        if self.heartbeat is None or self._said_closing or self._gone:
            return False
        with self._cond:
            self._beats_asked += 1
            asked = self._beats_asked
            self._in_a_stage = True  # a rank that raised before any step is heard too
            self._next_beat = 0.0
            self._cond.notify_all()
            deadline = time.monotonic() + wait
            while wait > 0 and self._beats_built < asked and not self._closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def stage_entered(self) -> None:
        """The rank entered its first stage (span): heartbeats start now if no step did."""
        if not self._in_a_stage:
            with self._cond:
                self._in_a_stage = True
                self._cond.notify_all()

    @property
    def pending(self) -> int:
        """Steps not yet acknowledged."""
        return len(self._pending) + len(self._raw) + self._packing

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def alive(self) -> bool:
        """Whether the sender thread runs."""
        return self._thread.is_alive()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every message was acknowledged; False if ``timeout`` passed first or
        nothing can be sent any more. With messages retained, also wait for a fresh probe. Once
        closed (an integration closes its Reporter at the framework's end of training): whether
        the close left nothing undelivered."""
        if self._closed:
            return self._closed_whole
        deadline = None if timeout is None else time.monotonic() + timeout
        probes = self._probes
        with self._cond:
            target = probes.done
            if self._retained:
                probes.asked += 1
                target = probes.asked
                probes.next_at = 0.0
            self._cond.notify_all()
            while not self._gone and (self._pending or self._raw or self._packing or (
                    self._retained and probes.done < target)):
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left if left is not None else 0.5)
        return not self._gone

    def close(self, timeout: float = 10.0) -> None:
        """Flush for up to ``timeout`` seconds, then stop; what is still unsent counts as
        dropped. Closing twice is harmless."""
        if self._closed:
            return
        # Everything within ``timeout`` (at exit, what is left of RLMON_EXIT_TIMEOUT): the
        # flush, then the closing heartbeat (a share kept for it), then the sender's join
        deadline = time.monotonic() + timeout
        self.flush(timeout - min(_CLOSING_SHARE_S, timeout / 4))
        # the stream ended (how: its outcome), it did not vanish: said by a rank that sent a step
        # or entered a stage (a crash while loading the model pages too)
        if (self.sent or self._in_a_stage) and not self._gone:
            self._said_closing = True
            closing = threading.Thread(target=self._beat, kwargs={"closing": True}, daemon=True,
                                       name="rlmon-closing-heartbeat")
            closing.start()
            closing.join(max(0.0, deadline - time.monotonic()))
        with self._cond:
            self._closed = True
            lost = len(self._pending) + len(self._raw)
            self.dropped += lost
            self._closed_whole = not lost and not self._gone
            self._pending.clear()
            self._raw.clear()
            self._cond.notify_all()
        # A sender waiting for work stops at once; one still inside a call to the sink (Ray
        # starting, or still being imported) is a daemon, waited for only within ``timeout``
        self._thread.join(timeout=max(0.0, min(5.0, deadline - time.monotonic()))
                          if self._calling else 5.0)
        if lost:  # never lost silently (the exit flush closes with what its budget left)
            reason = None
            with contextlib.suppress(Exception):  # the line below says what was lost all the same
                reason = None if self._gone else getattr(self.sink, "undelivered", _no_reason)()
            if reason:  # Ray still starting at the exit budget's end: the sink says it plainly
                log.warning("rlmon: %s/%s: %s; %d step message(s) not delivered within %.1fs "
                            "(counted as dropped)", self.run, self.role, reason, lost, timeout)
                return
            why = "" if self._gone else (  # a sink that gave up said why itself
                f"; last error: {self.tally.last_error or 'none (still sending)'}")
            log.warning("rlmon: %s/%s: closed with %d step message(s) not delivered within "
                        "%.1fs (counted as dropped)%s", self.run, self.role, lost, timeout, why)

    # -- the sender thread ----------------------------------------------------------------------

    def _trim(self) -> None:
        while len(self._raw) + len(self._pending) > self.max_pending:
            if self._pending:
                self._pending.popleft()
            else:
                self._raw.popleft()
            self.dropped += 1

    def _probe_due(self) -> float | None:
        """Seconds until the next incarnation probe (0: now), or None when none is needed."""
        if not self._retained:
            return None
        return max(0.0, self._probes.next_at - time.monotonic())

    def _beat_due(self) -> float | None:
        """Seconds until the next heartbeat (0: now), or None when none is sent."""
        if self.heartbeat is None or self._gone or self._said_closing or not (
                self.sent or self._in_a_stage):
            return None
        if not self._period_told:
            told = getattr(self.sink, "heartbeat_seconds", None)
            if isinstance(told, (int, float)) and told > 0:
                self._period_told = True
                self._next_beat += told - self.heartbeat_s
                self.heartbeat_s = float(told)
        return max(0.0, self._next_beat - time.monotonic())

    def _beat(self, closing: bool = False) -> None:
        """Send a heartbeat alone (nothing else to send); a failure waits for the next one."""
        self._next_beat = time.monotonic() + self.heartbeat_s
        asked = self._beats_asked  # the beat_now calls this heartbeat answers (built after)
        send = getattr(self.sink, "heartbeat", None)
        if self.heartbeat is None or send is None:
            return
        try:
            with self._beat_lock:
                if self._said_closing and not closing:
                    return
                send([self.heartbeat(closing)])
            with self._cond:
                self.heartbeats += 1
                self._beats_built = max(self._beats_built, asked)
                if self._beats_asked > asked:
                    self._next_beat = 0.0  # asked while this one was built: one more, now
                self._cond.notify_all()  # beat_now may be waiting for it
        except Exception as exc:
            if isinstance(exc, SinkClosed):
                self._give_up(exc)
                return
            self.tally.last_error = f"heartbeat: {type(exc).__name__}: {exc}"

    def _riding(self, batch: list[StepMessage]) -> tuple[list[StepMessage], int | None]:
        """The batch as sent: its last message carries the heartbeat when one is due (the
        retained copies do not: a resend would carry a stale one); and the beat_now calls that
        heartbeat answers once the batch is sent (None: none rides)."""
        due = self._beat_due()
        if self.heartbeat is None or due is None or due > 0:
            return batch, None
        self._next_beat = time.monotonic() + self.heartbeat_s
        self.heartbeats += 1
        asked = self._beats_asked  # built after: it answers these
        return [*batch[:-1], replace(batch[-1], heartbeat=self.heartbeat(False))], asked

    def _probe(self, asked: int) -> None:
        """Ask the aggregator who it is, so retained messages reach a restarted one.

        Without this a reporter that has nothing new to send would never learn of a restart, and
        the steps it had sent but that were still open would finalize without it.
        """
        probe = getattr(self.sink, "probe", None)
        try:
            ack = probe(self.run, self.role) if probe is not None else self.sink.send([])
        except Exception as exc:  # unreachable: try again later; flush() keeps waiting
            if isinstance(exc, SinkClosed):
                self._give_up(exc)
                return
            with self._cond:
                self.tally.last_error = f"{type(exc).__name__}: {exc}"
                self._probes.next_at = time.monotonic() + _PROBE_RETRY_S
            return
        with self._cond:
            self._probes.next_at = time.monotonic() + PROBE_S
            if ack is not None:
                self._retain([], ack)
            self._probes.done = max(self._probes.done, asked)
            self._cond.notify_all()

    def _pack_all(self, raws: list[Raw]) -> list[StepMessage]:
        """Pack closed steps in order; one that cannot be packed is dropped and counted."""
        packed = []
        for raw in raws:
            try:
                packed.append(self.pack(raw, Stamp(self._seq + 1, self.dropped, self.started)))
            except Exception as exc:  # not a number, too large for a float, a bad count
                self.tally.last_error = f"step {raw.step}: {type(exc).__name__}: {exc}"
                self.dropped += 1
                continue
            self._seq += 1
        return packed

    def _send_loop(self) -> None:
        backoff = _BACKOFF_S[0]
        while True:
            probe_asked: int | None = None
            beat = False
            with self._cond:
                while not self._pending and not self._raw and not self._closed:
                    due = self._probe_due()
                    if due == 0.0:
                        probe_asked = self._probes.asked
                        break
                    beat_due = self._beat_due()
                    if beat_due == 0.0:
                        beat = True
                        break
                    waits = [d for d in (due, beat_due) if d is not None]
                    self._cond.wait(min(waits) if waits else None)
                if probe_asked is None and not beat and not self._pending and not self._raw \
                        and self._closed:
                    return
            if beat:
                self._calling = True
                try:
                    self._beat()
                finally:
                    self._calling = False
                if self._gone:
                    return
                continue
            if probe_asked is not None:
                self._calling = True
                try:
                    self._probe(probe_asked)
                finally:
                    self._calling = False
                if self._gone:
                    return
                continue
            with self._cond:
                raw = list(self._raw)
                self._raw.clear()
                self._packing = len(raw)  # neither raw nor pending while packed: flush waits
            packed = self._pack_all(raw)
            with self._cond:
                self._pending.extend(packed)
                self._packing = 0
                self._trim()
                if not self._pending:
                    self._cond.notify_all()  # a flush waiting on what was dropped returns now
                    continue
                batch = [self._pending[i] for i in range(min(self.max_batch, len(self._pending)))]
            try:
                self._calling = True
                try:
                    sent, beat_answers = self._riding(batch)
                    ack = self.sink.send(sent)
                finally:
                    self._calling = False
            except Exception as exc:  # the aggregator is slow, restarting or gone: keep and retry
                self.tally.last_error = f"{type(exc).__name__}: {exc}"
                if isinstance(exc, SinkClosed):
                    self._give_up(exc)
                    return
                with self._cond:
                    if self._closed:
                        return
                    self._cond.wait(backoff)
                backoff = min(backoff * 2, _BACKOFF_S[1])
                continue
            backoff = _BACKOFF_S[0]
            last = batch[-1].seq
            with self._cond:
                while self._pending and self._pending[0].seq <= last:
                    self._pending.popleft()
                self.sent += len(batch)
                self._refused_by_aggregator(ack)
                self._retain(batch, ack)
                if beat_answers is not None:  # beat_now waits for the heartbeat that rode
                    self._beats_built = max(self._beats_built, beat_answers)
                    if self._beats_asked > beat_answers:
                        self._next_beat = 0.0  # asked while it was built: one more, now
                self._cond.notify_all()

    def _give_up(self, exc: Exception) -> None:
        """Ray is gone for good: count what can no longer be sent, say it once, stop."""
        with self._cond:
            lost = len(self._pending) + len(self._raw)
            self.dropped += lost
            self._pending.clear()
            self._raw.clear()
            self._retained.clear()
            self._gone = True
            self._cond.notify_all()
        if lost or not self._closed:
            log.warning("rlmon: %s/%s: %s; %d step message(s) not sent (counted as dropped)",
                        self.run, self.role, exc, lost)
        else:  # close() already counted and said what it dropped
            log.warning("rlmon: %s/%s: %s", self.run, self.role, exc)

    def _refused_by_aggregator(self, ack: Any) -> None:
        """What the aggregator refused of a sent batch: counted and said, like a local refusal."""
        rejected = getattr(ack, "rejected", 0)
        if rejected:
            errors = getattr(ack, "errors", None) or ["(no reason given)"]
            self.refused_messages += rejected
            self.tally.last_error = f"refused by the aggregator: {errors[0]}"
            reason = errors[0].split(": ", 1)[-1]  # without its "run/role step N: " origin
            self.tally.say_once(
                reason, "rlmon: %s/%s: the aggregator refused %d step message(s): %s",
                self.run, self.role, rejected, errors[0])

    def _retain(self, batch: list[StepMessage], ack: Any) -> None:
        """Keep acknowledged messages of open steps; resend them to a restarted aggregator.
        Take the run's stop decision from the ack when it applies to this Reporter."""
        decision = (getattr(ack, "stops", None) or {}).get(self.run)
        if decision is not None and decision != self.stop_decision and decision.applies_to(
                self.started):
            if self.stop_decision is None:
                log.warning("rlmon: %s/%s: the service asks this run to stop: %s", self.run,
                            self.role, decision.reason)
            self.stop_decision = decision
        incarnation = getattr(ack, "incarnation", None)
        floors = getattr(ack, "floors", None)
        if not incarnation or floors is None:
            return
        if self._incarnation is not None and incarnation != self._incarnation:
            # The aggregator restarted: the open steps it held are gone; rebuild them.
            self.resent += len(self._retained)
            self._pending.extendleft(replace(m, resend=True) for m in reversed(self._retained))
            self._retained.clear()
        self._incarnation = incarnation
        self._retained.extend(batch)
        floor = floors.get((self.run, self.role), 0)
        self._retained = deque(m for m in self._retained if m.step >= floor)
        while len(self._retained) > self.max_pending:
            self._retained.popleft()
