"""The walk of a finalized step (and of a liveness view) through the service is a line, not a
star: the core hands the batch to the spine and gets the verdict's transitions back, returning
to ``service_core.py`` at most 3 times (docs/design.md, "The spine": 10 at 68dea3e)."""

from __future__ import annotations

import math

from rlmon.service import service_core
from rlmon.service.liveness.run_state import LivenessView, RunState
from rlmon.service.service_core import ServiceCore
from tests.support.records import step_record
from tests.support.walk import walk

T0 = 1_700_000_000.0


def test_a_step_that_fires_walks_the_spine_and_returns_to_the_core_at_most_three_times() -> None:
    core = ServiceCore(clock=lambda: T0)
    try:
        core.publish([step_record(step=0, finalized_at=T0)])  # the stream is known
        record = step_record(step=1, finalized_at=T0, metrics={"actor/loss": math.nan})
        events: list = []
        traced = walk(service_core.__file__, lambda: events.extend(core.publish([record])))
        assert [e.alert for e in events] == ["NonFiniteMetric"]  # it fired, stored, handed over
        assert core.history.alerts("r")  # and the walk went all the way to the store
        assert traced.returns <= 3, traced
        assert traced.rooms == ["rlmon.service.spine.line"], traced
        # the stages the step went through, each a room of its own
        for stage in ("memory", "judge", "stops", "commit", "sinks", "verdict"):
            assert f"rlmon.service.spine.{stage}" in traced.entered, stage
    finally:
        core.close(0.0)


def test_a_liveness_view_walks_the_same_line() -> None:
    core = ServiceCore(clock=lambda: T0)
    try:
        view = LivenessView("r", "actor", RunState.DEAD, T0, T0, 3, T0 - 60, T0 - 1, 1.0,
                            90.0, 1, heartbeats=True)
        events: list = []
        traced = walk(service_core.__file__, lambda: events.extend(core.liveness([view])))
        assert [(e.alert, e.state) for e in events] == [("RunDied", "firing")]
        assert traced.returns <= 3, traced
        assert traced.rooms == ["rlmon.service.spine.line"], traced
    finally:
        core.close(0.0)
