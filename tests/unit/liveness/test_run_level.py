"""A run's state from its roles' states (rlmon.service.liveness.run_level)."""

from __future__ import annotations

import pytest

from rlmon.service.liveness.run_level import run_state
from rlmon.service.liveness.run_state import RunState


@pytest.mark.parametrize(("roles", "run"), [
    (["running", "running"], "running"),
    (["running", "stalled", "running"], "stalled"),  # one stalled role stalls the run
    (["stalled", "dead"], "dead"),
    (["finished", "finished"], "finished"),
    (["finished", "running"], "running"),  # a role that ended early: the run goes on
    (["finished", "failed"], "failed"),
    (["preempted", "finished"], "preempted"),
    (["failed", "preempted"], "failed"),
    (["frozen", "slow"], "frozen"),
    (["slow", "running", "unknown"], "slow"),
    (["unknown", "finished"], "finished"),  # a role not judged does not hide the others
    (["unknown", "unknown"], "unknown"),
    ([], "unknown"),
])
def test_a_run_is_as_bad_as_its_worst_role(roles: list[str], run: str) -> None:
    assert run_state(roles) == run


def test_every_liveness_state_is_ranked_and_a_new_one_flows_through() -> None:
    # each state the tracker knows outranks a finished role
    for state in RunState:
        assert run_state([state, "finished"]) == state.value
    # an outcome added later is shown as it is: above running and finished, below the faults
    assert run_state(["running", "ended_by_scheduler", "finished"]) == "ended_by_scheduler"
    assert run_state(["ended_by_scheduler", "stalled"]) == "stalled"
