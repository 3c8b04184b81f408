"""The sink protocol (rlmon.service.spine.sink): a sink of one's own, given to the core, hears
what the built-in ones hear: each stored verdict of steps and of liveness views, the runs'
metadata and ends, the streams and runs that leave memory, and the service's start and close."""

from __future__ import annotations

import math

import pytest

from rlmon.service.aggregation.stream_tracker import Expired
from rlmon.service.config import Settings
from rlmon.service.contract.run_info import RunInfo
from rlmon.service.forward.sink import ForwardSink
from rlmon.service.liveness.run_state import LivenessView, RunState
from rlmon.service.service_core import ServiceCore
from rlmon.service.spine.sink import Sinks, StepSink
from rlmon.service.spine.sinks import ExporterSink, GoodputSink, OtlpSink, SanitySink
from rlmon.service.spine.verdict import Verdict
from tests.support.records import step_record
from tests.support.scrape import scrape

T0 = 1_700_000_000.0


class Heard(StepSink):
    """A sink that keeps what it heard, in order."""

    def __init__(self) -> None:
        self.heard: list[tuple[str, object]] = []

    def start(self) -> None:
        self.heard.append(("start", None))

    def record(self, verdict: Verdict) -> None:
        self.heard.append(("record", verdict))

    def run_info(self, run: str, info: RunInfo) -> None:
        self.heard.append(("run_info", (run, info.framework)))

    def finish_run(self, run: str) -> None:
        self.heard.append(("finish_run", run))

    def forget(self, expired: Expired) -> None:
        self.heard.append(("forget", (expired.streams, expired.runs)))

    def close(self, timeout: float) -> None:
        self.heard.append(("close", timeout))


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def test_a_sink_of_ones_own_hears_every_stored_verdict_and_the_runs_lifecycle() -> None:
    sink, clock = Heard(), Clock()
    settings = Settings.model_validate({"retention": {"stream_ttl_seconds": 60,
                                                      "every_seconds": 1}})
    core = ServiceCore(settings, clock=clock, sinks=[sink])
    assert list(core.spine.sinks)[-1] is sink  # after the built-in ones
    try:
        core.set_run_info("r", {"framework": "trl"})
        events = core.publish([step_record(step=0, finalized_at=T0),
                               step_record(step=1, finalized_at=T0,
                                           metrics={"actor/loss": math.nan})])
        core.publish([step_record(step=1, finalized_at=T0)])  # a redelivery: nothing new
        view = LivenessView("r", "actor", RunState.DEAD, T0, T0, 1, T0 - 60, T0 - 1, 1.0, 90.0,
                            1, heartbeats=True)
        dead = core.liveness([view])
        core.finish_run("r")
        clock.now += 3_600  # long quiet: the stream and run leave memory with the next batch
        core.publish([step_record(run="other", step=0, finalized_at=clock.now)])
    finally:
        core.close(0.5)
    kinds = [k for k, _ in sink.heard]
    assert kinds == ["run_info", "record", "record", "record", "finish_run", "record",
                     "forget", "close"]
    assert sink.heard[0] == ("run_info", ("r", "trl"))
    first, again, seen, _other = [v for k, v in sink.heard if k == "record"]
    assert isinstance(first, Verdict) and first.kind == "steps"
    assert [r.step for r in first.records] == [0, 1]
    assert first.events == events and [e.alert for e in events] == ["NonFiniteMetric"]
    assert isinstance(again, Verdict) and again.records == () and again.events == []
    assert isinstance(seen, Verdict) and seen.kind == "liveness"
    assert seen.views[0].state is RunState.DEAD and seen.events == dead
    assert sink.heard[4] == ("finish_run", "r")
    assert sink.heard[6] == ("forget", ([("r", "actor")], ["r"]))
    assert sink.heard[-1] == ("close", 0.5)


def test_start_starts_every_sink_once() -> None:
    sink = Heard()
    core = ServiceCore(Settings(), sinks=[sink])
    try:
        core.start().start()
        assert sink.heard == [("start", None)]
    finally:
        core.close(0.0)


def test_the_sinks_are_found_by_kind_and_a_missing_kind_is_named() -> None:
    core = ServiceCore(Settings())
    try:
        sinks = core.spine.sinks
        assert [type(s) for s in sinks] == [ExporterSink, SanitySink, OtlpSink, ForwardSink,
                                            GoodputSink]
        assert sinks[ExporterSink].metrics is core.metrics
        with pytest.raises(KeyError, match="no Heard among the service's sinks"):
            sinks[Heard]
    finally:
        core.close(0.0)


def test_a_sink_that_does_not_record_says_so() -> None:
    with pytest.raises(NotImplementedError, match="StepSink does not record verdicts"):
        Sinks([StepSink()]).record(Verdict("steps", T0))


class Stored(StepSink):
    """Whether each verdict's steps were in the history store when the sink heard it."""

    def __init__(self, core: list[ServiceCore], before: bool) -> None:
        self.core, self.saw = core, []
        self.before_commit = before  # type: ignore[misc]

    def record(self, verdict: Verdict) -> None:
        self.saw.append([self.core[0].history.has_step(*r.key, r.attempt)
                         for r in verdict.records])


def test_what_the_service_shows_hears_a_step_before_the_commit_and_the_outputs_after() -> None:
    assert [kind.before_commit for kind in (ExporterSink, SanitySink, OtlpSink, ForwardSink,
                                            GoodputSink, StepSink)] == [
        True, True, False, False, False, False]
    holder: list[ServiceCore] = []
    before, after = Stored(holder, True), Stored(holder, False)
    core = ServiceCore(clock=lambda: T0, sinks=[before, after])
    holder.append(core)
    try:
        core.publish([step_record(step=0, finalized_at=T0)])
        assert (before.saw, after.saw) == ([[False]], [[True]])

        def failing(*args: object, **kwargs: object) -> None:
            raise OSError("disk full")

        core.history.add = failing  # type: ignore[method-assign]
        with pytest.raises(OSError, match="disk full"):
            core.publish([step_record(step=1, finalized_at=T0,
                                      metrics={"actor/loss": math.nan})])
        # /metrics shows the step and its alert although the write failed; the outputs that
        # leave the process heard nothing (the aggregator delivers the batch again)
        assert before.saw[-1] == [False] and len(after.saw) == 1
        firing = {dict(lbl).get("alert") for (name, lbl), value in scrape(core.metrics).items()
                  if name == "rlmon_alert_firing" and value == 1}
        assert firing == {"NonFiniteMetric"}
    finally:
        core.close(0.0)
