"""The aggregator hands records to the service in step order per (run, role).

Alerts are evaluated per (run, role) in increasing step order, whatever order records arrived in
(docs/design.md, "The replay contract"). A step that finalizes at its deadline after a later step
completed must still reach the alert engine (and fire its RankMissing), not be skipped as out of
order.
"""

from __future__ import annotations

from rlmon.service.aggregation.aggregator import AggregatorCore
from rlmon.service.aggregation.deadline import DeadlinePolicy
from rlmon.service.alerting.engine import AlertEngine
from rlmon.service.alerting.rules import default_rules
from rlmon.service.contract.step_message import StepMessage, columns_from_states
from rlmon.service.metrics.rank import Rank, World
from rlmon.service.metrics.spec import Form
from tests.support.clock import FakeClock

_WORLD = World(dp=2)


def _msg(step: int, dp: int, run: str = "r", role: str = "actor") -> StepMessage:
    cols = columns_from_states({"actor/loss": (Form.MEAN, (1.0, 1.0))})
    return StepMessage(run, role, step, Rank(dp=dp), _WORLD, step + 1, 0.0, cols)


def _deliver(core: AggregatorCore, engine: AlertEngine) -> list[tuple[str, str, int]]:
    records = core.pending_records()
    events = [e for r in records for e in engine.evaluate(r)]
    core.delivered(records)
    return [(e.alert, e.state, e.step) for e in events]


def test_a_step_finalized_late_at_its_deadline_is_evaluated_before_later_steps() -> None:
    clock = FakeClock(0.0)
    core = AggregatorCore(deadline=DeadlinePolicy(fixed=5.0), clock=clock)
    engine = AlertEngine(default_rules())
    core.ingest([_msg(3, 0), _msg(3, 1)])
    assert _deliver(core, engine) == []
    core.ingest([_msg(4, 0)])  # rank 1's step 4 is lost
    core.ingest([_msg(5, 0), _msg(5, 1)])  # step 5 completes while step 4 is open
    assert core.pending_records() == []  # step 5 is held behind the open step 4
    assert core.stats().held_out_of_order == 1
    clock.advance(10)
    assert core.tick() == 1
    assert [(r.step, r.complete) for r in core.pending_records()] == [(4, False), (5, True)]
    events = _deliver(core, engine)
    assert ("RankMissing", "firing", 4) in events
    assert ("RankMissing", "resolved", 5) in events
    assert engine.skipped_out_of_order == 0
    assert core.stats().held_out_of_order == 0


def test_holding_back_is_per_run_and_role() -> None:
    """An open step of one (run, role) holds nothing of another stream."""
    core = AggregatorCore(deadline=DeadlinePolicy(fixed=5.0), clock=lambda: 0.0)
    core.ingest([_msg(0, 0)])  # (r, actor) step 0 open
    core.ingest([_msg(1, 0, role="critic"), _msg(1, 1, role="critic")])
    core.ingest([_msg(2, 0, run="other"), _msg(2, 1, run="other")])
    assert sorted((r.run, r.role, r.step) for r in core.pending_records()) == [
        ("other", "actor", 2), ("r", "critic", 1)]
    core.ingest([_msg(1, 0), _msg(1, 1)])  # (r, actor) step 1 complete, step 0 still open
    assert all(r.role != "actor" or r.run != "r" for r in core.pending_records())
    core.ingest([_msg(0, 1)])  # step 0 completes: both are released, in order
    assert [r.step for r in core.pending_records() if (r.run, r.role) == ("r", "actor")] == [0, 1]
