"""``flush`` after ``close``: an integration closes its Reporter at the framework's end of
training, and the script's own ``flush`` afterwards asks whether everything arrived."""

from __future__ import annotations

from rlmon.actors.reporter import Reporter
from rlmon.actors.reporter.sink import LocalSink


def test_flush_after_a_whole_close_says_everything_was_delivered() -> None:
    sink = LocalSink()
    rep = Reporter("r", "actor", rank={}, world={}, sink=sink, hardware_interval=None,
                   step_seconds=False)
    for step in range(3):
        rep.record("actor/loss", sum=1.0, count=2)
        rep.end_step(step)
    rep.close(10.0)
    assert [r.step for r in sink.records] == [0, 1, 2]
    assert rep.flush(0.0) is True  # at once: nothing is left to wait for


def test_flush_after_a_close_that_dropped_steps_says_so() -> None:
    class Refusing(LocalSink):
        def send(self, *args: object, **kwargs: object) -> object:
            raise ConnectionError("the aggregator is unreachable")

    rep = Reporter("r", "actor", rank={}, world={}, sink=Refusing(), hardware_interval=None,
                   step_seconds=False)
    rep.record("actor/loss", sum=1.0, count=2)
    rep.end_step(0)
    rep.close(0.2)
    assert rep.flush(0.0) is False
