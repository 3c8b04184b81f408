"""The Reporter's heartbeat comes from its sender thread: a training thread stuck in a span does
not stop it and is named in it; a clean close says so (docs/liveness.md)."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest

from rlmon.actors.reporter.facade import Reporter
from rlmon.actors.reporter.sink import LocalSink
from rlmon.service.contract.acks import IngestAck
from rlmon.service.contract.heartbeat import Heartbeat
from rlmon.service.contract.step_message import StepMessage
from tests.support.polling import wait_for


class BeatSink(LocalSink):
    """A local sink that also keeps the heartbeats, alone or riding on step messages."""

    def __init__(self) -> None:
        super().__init__()
        self.beats: list[Heartbeat] = []

    def send(self, messages: Sequence[StepMessage]) -> IngestAck:
        self.beats.extend(m.heartbeat for m in messages if m.heartbeat is not None)
        return super().send(messages)

    def heartbeat(self, beats: Sequence[Heartbeat]) -> None:
        self.beats.extend(beats)


def test_a_hung_training_thread_keeps_heartbeating_where_it_is() -> None:
    sink = BeatSink()
    rep = Reporter("hb", "actor", rank={"dp": 0}, world={"dp": 1}, sink=sink,
                   hardware_interval=None, heartbeat_seconds=0.05)
    release = threading.Event()

    def train() -> None:
        rep.record("actor/loss", sum=1.0, count=1.0)
        rep.end_step(0)
        with rep.span("rollout"), rep.span("generate"):
            release.wait(30)  # hung in a collective
        rep.end_step(1)

    worker = threading.Thread(target=train)
    worker.start()
    try:
        stuck = wait_for(lambda: [b for b in sink.beats if b.ranks[0].spans], 10,
                         "a heartbeat naming the open spans")
        spans = stuck[-1].ranks[0].spans
        assert [s.name for s in spans] == ["rollout", "generate"]
        assert stuck[-1].ranks[0].last_step == 0
        count = len(sink.beats)
        wait_for(lambda: len(sink.beats) >= count + 3, 10, "heartbeats while the thread hangs")
    finally:
        release.set()
        worker.join()
    rep.close()
    assert sink.beats[-1].closing
    assert not any(b.closing for b in sink.beats[:-1])


def test_a_stage_entered_before_any_step_starts_the_heartbeats() -> None:
    """A cold load or the first weight sync before step 0: the service hears of the rank and
    where it is from the first span on, not only from its first step."""
    sink = BeatSink()
    rep = Reporter("hb0", "actor", rank={"dp": 0}, world={"dp": 1}, sink=sink,
                   hardware_interval=None, heartbeat_seconds=0.05)
    release = threading.Event()
    assert not release.wait(0.2) and sink.beats == []  # nothing entered, nothing sent: no beat

    def train() -> None:
        with rep.span("weight_sync"):
            release.wait(30)  # the first broadcast hangs

    worker = threading.Thread(target=train)
    worker.start()
    try:
        beats = wait_for(lambda: [b for b in sink.beats if b.ranks[0].spans], 10,
                         "a heartbeat before any step")
        assert [s.name for s in beats[-1].ranks[0].spans] == ["weight_sync"]
        assert beats[-1].ranks[0].last_step is None and not beats[-1].closing
    finally:
        release.set()
        worker.join()
    rep.close()
    assert sink.beats[-1].closing


class ToldSink(BeatSink):
    """A sink whose service told its heartbeat period when it connected (as ``RaySink`` reads
    it from the service's layout): a Ray actor's Reporter, whose environment is Ray's."""

    heartbeat_seconds = 0.05


def test_a_reporter_not_told_its_period_heartbeats_at_the_service_s(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RLMON_LIVENESS__HEARTBEAT_SECONDS", raising=False)
    sink = ToldSink()
    rep = Reporter("told", "actor", rank={"dp": 0}, world={"dp": 1}, sink=sink,
                   hardware_interval=None)
    release = threading.Event()
    worker = threading.Thread(target=lambda: _hang_in("train", rep, release))
    worker.start()
    try:  # at the default 5 s, ten would take 45 s
        wait_for(lambda: len(sink.beats) >= 10, 10, "ten heartbeats at the service's period")
    finally:
        release.set()
        worker.join()
        rep.close()
    # its own setting wins: told 0.05 s, set to an hour, it sends only the first
    sink = ToldSink()
    rep = Reporter("own", "actor", rank={"dp": 0}, world={"dp": 1}, sink=sink,
                   hardware_interval=None, heartbeat_seconds=3600.0)
    release = threading.Event()
    worker = threading.Thread(target=lambda: _hang_in("train", rep, release))
    worker.start()
    try:
        wait_for(lambda: sink.beats, 10, "the first heartbeat")
        assert not release.wait(0.5) and len(sink.beats) == 1
    finally:
        release.set()
        worker.join()
        rep.close()


def _hang_in(stage: str, rep: Reporter, release: threading.Event) -> None:
    with rep.span(stage):
        release.wait(30)
