"""A Reporter says its planned steps, and an exception leaving a watched method in a heartbeat at
once (rlmon.actors.reporter.actor_end), cleared by the next step; outside a Ray actor there is
no graceful shutdown to register for."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from rlmon.actors.reporter import Reporter, watch_methods
from rlmon.actors.reporter.actor_end import register_shutdown
from rlmon.actors.reporter.sink import LocalSink
from rlmon.service.contract.heartbeat import Heartbeat, check_heartbeat
from tests.support.polling import wait_for


class BeatSink(LocalSink):
    """A LocalSink that keeps the heartbeats (checked as the aggregator checks them)."""

    def __init__(self) -> None:
        super().__init__()
        self.beats: list[Heartbeat] = []
        self.lock = threading.Lock()

    def heartbeat(self, beats: list[Heartbeat]) -> None:
        with self.lock:
            self.beats += [check_heartbeat(b) for b in beats]


def test_total_steps_and_a_raising_method_are_said_in_heartbeats() -> None:
    sink = BeatSink()
    rep = Reporter("r", "actor", rank={}, world={}, sink=sink, start_service=False,
                   heartbeat_seconds=30.0, total_steps=12, hardware_interval=None)

    @watch_methods
    class Rank:
        def step(self, fail: bool) -> int:
            with rep.span("reward"):
                if fail:
                    raise ValueError("reward model returned NaN for every sample")
            return 1

    try:
        rep.end_step(0)
        assert rep.flush(10.0)
        assert Rank().step(False) == 1
        with pytest.raises(ValueError, match="reward model returned NaN"):
            Rank().step(True)  # the heartbeat left before the exception reached the caller
        with sink.lock:
            last: Any = sink.beats[-1]
        assert last.total_steps == 12 and last.raised is not None
        assert (last.raised.exc_type, last.raised.message) == (
            "ValueError", "reward model returned NaN for every sample")
        assert [s.name for s in last.ranks[0].spans] == ["reward"]  # where it was raised
        rep.end_step(1)  # the run went on: no longer said
        assert rep.flush(10.0)
        rep._delivery.beat_now(10.0)
        wait_for(lambda: sink.beats[-1].raised is None, 10.0, "a heartbeat without it")
    finally:
        rep.close(10.0)
    with pytest.raises(ValueError, match="total_steps"):
        rep.set_total_steps(0)


def test_a_raising_method_waits_for_a_slow_heartbeat_to_reach_the_aggregator() -> None:
    """On a loaded machine the heartbeat's round trip takes over a second: the exception leaves
    the method only once the note is with the aggregator (the driver then exits and Ray tears the
    actor down, and a note still in flight would be lost)."""

    class SlowSink(BeatSink):
        def __init__(self) -> None:
            super().__init__()
            self.answer = threading.Event()

        def heartbeat(self, beats: list[Heartbeat]) -> None:
            assert self.answer.wait(30.0)
            super().heartbeat(beats)

    sink = SlowSink()
    rep = Reporter("r3", "actor", rank={}, world={}, sink=sink, start_service=False,
                   heartbeat_seconds=30.0, hardware_interval=None)

    @watch_methods
    class Rank:
        def step(self) -> None:
            raise ValueError("reward model returned NaN for every sample")

    slow = threading.Timer(1.5, sink.answer.set)  # the aggregator answers 1.5 s later
    try:
        rep.end_step(0)
        assert rep.flush(10.0)  # step 0 sent: the note goes alone, not riding on its batch
        slow.start()
        with pytest.raises(ValueError, match="reward model returned NaN"):
            Rank().step()
        with sink.lock:
            assert [b.raised.exc_type for b in sink.beats if b.raised is not None] == [
                "ValueError"]
    finally:
        slow.cancel()
        sink.answer.set()
        rep.close(10.0)


def test_a_reporter_closed_after_a_raising_method_ends_with_that_exception() -> None:
    sink = BeatSink()
    rep = Reporter("r2", "actor", rank={}, world={}, sink=sink, start_service=False,
                   heartbeat_seconds=30.0, hardware_interval=None)
    rep.end_step(0)
    rep.note_raised(ValueError("bad batch"), wait=5.0)
    rep.close(10.0)  # the actor's exit flush, Ray's teardown: no step since it raised
    closing = [b for b in sink.beats if b.closing]
    assert closing and closing[-1].outcome is not None
    assert (closing[-1].outcome.exc_type, closing[-1].outcome.message) == ("ValueError",
                                                                          "bad batch")


def test_outside_an_actor_there_is_no_shutdown_to_register_for() -> None:
    assert register_shutdown(lambda: None) is False
