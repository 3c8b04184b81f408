"""The delivery protocol alone: hand-built step messages against sinks that ack, fail, restart
or are gone; nothing of the Reporter's recording or packing is involved."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import replace

import pytest

from rlmon.actors.reporter.delivery import Delivery, Stamp
from rlmon.actors.reporter.sink import SinkClosed
from rlmon.actors.reporter.tally import Tally
from rlmon.service.contract.acks import IngestAck
from rlmon.service.contract.step_message import StepMessage
from rlmon.service.contract.stop_decision import StopDecision
from rlmon.service.metrics.rank import Rank, World


def _step(step: int) -> StepMessage:
    """A step as the packer would leave it, before the delivery stamps it."""
    return StepMessage("r", "actor", step, Rank(), World(), 0, float(step))


def _stamped(msg: StepMessage, stamp: Stamp) -> StepMessage:
    return replace(msg, seq=stamp.seq, dropped=stamp.dropped, started=stamp.started)


def _delivery(sink: object, *, started: float = 100.0, **bounds: int) -> Delivery[StepMessage]:
    return Delivery(sink, _stamped, Tally("r", "actor"), run="r", role="actor",  # type: ignore[arg-type]
                    started=started, **bounds)  # type: ignore[arg-type]


class AckingSink:
    """An aggregator that keeps nothing: it acknowledges with its incarnation and the run's
    floor (the step below which every step is finalized), and answers probes (empty sends)."""

    def __init__(self) -> None:
        self.got: list[StepMessage] = []
        self.incarnation = "a"
        self.floor = 0
        self.stops: dict[str, StopDecision] = {}
        self.refuse = 0

    def send(self, messages: Sequence[StepMessage]) -> IngestAck:
        self.got.extend(messages)
        return IngestAck(accepted=len(messages) - self.refuse, rejected=self.refuse,
                         errors=["r/actor step 0: bad things"] * bool(self.refuse),
                         incarnation=self.incarnation, floors={("r", "actor"): self.floor},
                         stops=dict(self.stops))


def test_steps_are_sent_in_order_each_with_the_next_sequence_number() -> None:
    sink = AckingSink()
    d = _delivery(sink, max_batch=2)
    for step in range(5):
        d.put(_step(step))
    assert d.flush(5)
    assert [(m.step, m.seq, m.started, m.resend) for m in sink.got] == [
        (s, s + 1, 100.0, False) for s in range(5)]
    assert (d.sent, d.dropped, d.pending) == (5, 0, 0)
    d.close()
    assert not d.alive


def test_messages_of_open_steps_are_retained_and_resent_to_a_restarted_aggregator() -> None:
    sink = AckingSink()
    d = _delivery(sink)
    for step in range(3):
        d.put(_step(step))
    assert d.flush(5)
    sink.floor = 2  # steps 0 and 1 finalized: only step 2 is still retained
    assert d.flush(5)  # flush asks for a fresh probe and waits for its answer
    assert d.resent == 0
    sink.incarnation = "b"  # restarted: the open steps it held are gone
    assert d.flush(5)  # the probe learns it; step 2 is sent again before flush returns
    resends = [m for m in sink.got if m.resend]
    assert [(m.step, m.seq) for m in resends] == [(2, 3)]  # verbatim but for the flag
    assert d.resent == 1
    sink.floor = 3  # every step final: nothing retained, nothing to resend
    assert d.flush(5)
    sink.incarnation = "c"
    assert d.flush(5)
    assert len([m for m in sink.got if m.resend]) == 1
    d.close()


def test_a_failing_sink_is_retried_and_nothing_is_lost_or_reordered() -> None:
    inner = AckingSink()
    failures = [ConnectionError("aggregator restarting")] * 2

    class Flaky:
        def send(self, messages: Sequence[StepMessage]) -> IngestAck:
            if failures:
                raise failures.pop()
            return inner.send(messages)

    d = _delivery(Flaky())
    for step in range(4):
        d.put(_step(step))
    assert d.flush(10)
    assert [(m.step, m.seq) for m in inner.got] == [(s, s + 1) for s in range(4)]
    assert d.dropped == 0 and d.tally.last_error == "ConnectionError: aggregator restarting"
    d.close()


def test_beyond_the_bound_the_oldest_steps_are_dropped_and_counted_in_later_messages() -> None:
    inner = AckingSink()
    entered, release = threading.Event(), threading.Event()

    class Gated:
        def send(self, messages: Sequence[StepMessage]) -> IngestAck:
            entered.set()
            release.wait(10)
            return inner.send(messages)

    d = _delivery(Gated(), max_pending=3, max_batch=1)
    d.put(_step(0))
    assert entered.wait(5)  # step 0 is inside send; put never waits for it
    for step in range(1, 10):
        d.put(_step(step))
        assert d.pending <= 3
    release.set()
    assert d.flush(10)
    # Step 0 was in flight when the bound dropped it from the buffer (counted), and arrived.
    assert [m.step for m in inner.got] == [0, 7, 8, 9]
    assert d.dropped == 7
    assert [m.dropped for m in inner.got[1:]] == [7, 7, 7]  # the count travels
    d.close()


def test_a_step_that_cannot_be_packed_is_dropped_and_named() -> None:
    sink = AckingSink()

    def pack(msg: StepMessage, stamp: Stamp) -> StepMessage:
        if msg.step == 1:
            raise OverflowError("int too large to convert to float")
        return _stamped(msg, stamp)

    d = Delivery(sink, pack, Tally("r", "actor"), run="r", role="actor", started=1.0)
    for step in range(3):
        d.put(_step(step))
    assert d.flush(5)
    assert [(m.step, m.seq, m.dropped) for m in sink.got] == [(0, 1, 0), (2, 2, 1)]
    assert d.dropped == 1
    assert d.tally.last_error == "step 1: OverflowError: int too large to convert to float"
    assert d.alive
    d.close()


def test_a_closed_sink_gives_up_counts_what_it_held_and_says_so_once(
        caplog: pytest.LogCaptureFixture) -> None:
    entered, release = threading.Event(), threading.Event()

    class Gone:
        def send(self, messages: Sequence[StepMessage]) -> IngestAck:
            entered.set()
            release.wait(10)
            raise SinkClosed("Ray was shut down")

    d = _delivery(Gone())
    with caplog.at_level("WARNING", logger="rlmon"):
        d.put(_step(0))
        assert entered.wait(5)
        d.put(_step(1))
        release.set()
        assert not d.flush(5)  # nothing can be sent any more
        d.close()
    assert d.dropped == 2 and d.sent == 0 and not d.alive
    said = [r.getMessage() for r in caplog.records if "not sent" in r.getMessage()]
    assert said == ["rlmon: r/actor: Ray was shut down; 2 step message(s) not sent "
                    "(counted as dropped)"]


def test_close_counts_what_is_still_unsent_as_dropped_and_says_so(
        caplog: pytest.LogCaptureFixture) -> None:
    class Down:
        def send(self, messages: Sequence[StepMessage]) -> IngestAck:
            raise ConnectionError("no aggregator")

    d = _delivery(Down())
    with caplog.at_level("WARNING", logger="rlmon"):
        for step in range(2):
            d.put(_step(step))
        d.close(timeout=0.2)
        assert d.closed and not d.alive
        assert (d.dropped, d.sent, d.pending) == (2, 0, 0)
        d.close()  # twice: harmless
    assert d.dropped == 2
    said = [r.getMessage() for r in caplog.records if "not delivered" in r.getMessage()]
    assert said == ["rlmon: r/actor: closed with 2 step message(s) not delivered within 0.2s "
                    "(counted as dropped); last error: ConnectionError: no aggregator"]


def test_refusals_in_an_ack_are_counted_and_said_once(caplog: pytest.LogCaptureFixture) -> None:
    sink = AckingSink()
    sink.refuse = 1
    d = _delivery(sink, max_batch=1)
    with caplog.at_level("WARNING", logger="rlmon"):
        for step in range(3):
            d.put(_step(step))
        assert d.flush(5)
    d.close()
    assert d.refused_messages == 3
    assert d.tally.last_error == "refused by the aggregator: r/actor step 0: bad things"
    assert len([r for r in caplog.records if "refused" in r.getMessage()]) == 1


def test_a_stop_decision_applies_to_a_delivery_started_before_it(
        caplog: pytest.LogCaptureFixture) -> None:
    sink = AckingSink()
    decision = StopDecision("r", "actor", 4, "NonFiniteMetric", "loss is NaN", "*", at=150.0)
    sink.stops = {"r": decision, "other": replace(decision, run="other")}
    before, after = _delivery(sink, started=100.0), _delivery(sink, started=200.0)
    with caplog.at_level("WARNING", logger="rlmon"):
        for d in (before, after):
            d.put(_step(0))
            d.put(_step(1))
            assert d.flush(5)
            d.close()
    assert before.stop_decision == decision
    assert after.stop_decision is None  # a rerun started after the decision runs on
    said = [r.getMessage() for r in caplog.records if "asks this run to stop" in r.getMessage()]
    assert said == ["rlmon: r/actor: the service asks this run to stop: loss is NaN"]


def test_close_returns_within_its_timeout_when_a_call_to_the_sink_never_returns(
        caplog: pytest.LogCaptureFixture) -> None:
    """issue 29: a call stuck inside Ray (a probe in flight when the user's ray.shutdown() tore
    the worker down) held the sink's lock; the closing heartbeat waited on that lock and the
    script never exited. Now the close, its heartbeat and the sender's join share its timeout."""
    from rlmon.service.contract.heartbeat import Heartbeat
    from tests.support.polling import wait_for

    release = threading.Event()
    lock = threading.Lock()

    class Stuck:
        def __init__(self) -> None:
            self.calls = 0

        def send(self, messages: Sequence[StepMessage]) -> IngestAck:
            with lock:
                self.calls += 1
                if self.calls > 1:
                    release.wait()  # never returns while the test runs
                return IngestAck()

        def heartbeat(self, beats: Sequence[Heartbeat]) -> None:
            with lock:  # a sink's calls share its lock, as RaySink's do
                pass

    sink = Stuck()
    beat = Heartbeat("r", "actor", World(dp=1), (), 1.0)
    d = Delivery(sink, _stamped, Tally("r", "actor"), run="r", role="actor",  # type: ignore[arg-type]
                 started=1.0, heartbeat=lambda closing: replace(beat, closing=closing))
    d.put(_step(0))
    wait_for(lambda: d.sent == 1, 30, "the first step sent")
    d.put(_step(1))
    wait_for(lambda: sink.calls == 2, 30, "the sender stuck inside its second call")
    closed = threading.Event()

    def close() -> None:
        d.close(timeout=0.3)
        closed.set()

    with caplog.at_level("WARNING", logger="rlmon"):
        threading.Thread(target=close, daemon=True).start()
        try:
            assert closed.wait(60), "close() is held by a sink call that never returns"
        finally:
            release.set()
    assert d.closed and d.dropped == 1
    assert any("1 step message(s) not delivered" in r.getMessage() for r in caplog.records)


def test_a_heartbeat_asked_for_that_rides_on_a_step_answers_the_ask() -> None:
    """``beat_now`` (a raising actor method's ``note_raised``) returns once its heartbeat has
    left, also when it left riding on a step message rather than alone: it waited out its
    whole timeout before, and said it had not gone."""
    from rlmon.service.contract.heartbeat import Heartbeat

    gate, inside = threading.Event(), threading.Event()

    class Gated(AckingSink):
        def send(self, messages: Sequence[StepMessage]) -> IngestAck:
            inside.set()
            gate.wait(30)  # the first call holds the sender until the heartbeat is asked for
            return super().send(messages)

    sink = Gated()
    beat = Heartbeat("r", "actor", World(dp=1), (), 1.0)
    d = Delivery(sink, _stamped, Tally("r", "actor"), run="r", role="actor",  # type: ignore[arg-type]
                 started=1.0, heartbeat=lambda closing: replace(beat, closing=closing),
                 heartbeat_s=3600.0)
    d.put(_step(0))
    assert inside.wait(30)
    d.put(_step(1))  # waits behind step 0: the heartbeat asked for now rides on it
    opening = threading.Timer(0.05, gate.set)
    opening.start()
    try:
        assert d.beat_now(5.0)
    finally:
        opening.join()
        d.close(timeout=10.0)
    assert [m.step for m in sink.got] == [0, 1]
    assert sink.got[1].heartbeat is not None and sink.got[0].heartbeat is None
