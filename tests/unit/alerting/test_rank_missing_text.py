"""RankMissing names the missing ranks, how many of how many, since which step, and says what to
check and what to change."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from rlmon.service.alerting.engine import AlertEngine
from rlmon.service.alerting.rules import default_rules
from rlmon.service.config import Settings
from rlmon.service.contract.heartbeat import Heartbeat, OpenSpan, ProcessId, RankBeat
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.liveness.run_state import LivenessTracker
from rlmon.service.liveness.thresholds import LivenessParams
from rlmon.service.metrics.rank import Rank, World
from rlmon.service.service_core import ServiceCore
from tests.unit.liveness.support import T0, sim_clock


def _record(step: int, missing: tuple[Rank, ...]) -> StepRecord:
    return StepRecord("r", "actor", step, not missing, 4, 4 - len(missing), missing,
                      {"actor/loss": 1.0})


def test_rank_missing_names_the_rank_the_count_and_the_step_and_what_to_do() -> None:
    engine = AlertEngine([r for r in default_rules() if r.name == "RankMissing"])
    assert engine.evaluate(_record(11, ())) == []
    (event,) = engine.evaluate(_record(12, (Rank(dp=3),)))
    assert event.alert == "RankMissing" and event.state == "firing"
    assert event.detail.startswith("Missing dp=3 (1 of 4 ranks) from step 12 on.")
    assert "To change: restart the lost ranks" in event.detail
    assert event.what_to_check.startswith("the missing ranks' processes")
    many = tuple(Rank(dp=d, cp=c) for d in range(5) for c in range(2))
    record = StepRecord("r2", "actor", 3, False, 16, 6, many, {})
    (event,) = engine.evaluate(record)
    assert "dp=1 cp=1" in event.detail and "and 2 more (10 of 16 ranks) from step 3" \
        in event.detail


def test_rank_missing_says_where_the_missing_ranks_were_last_heard(tmp_path: Path) -> None:
    """The liveness tracker remembers each silent rank's last heartbeat (its stage, its host
    and Ray node, its last step); the service's RankMissing names them from the views."""
    tracker = LivenessTracker(LivenessParams())
    now = T0
    for step in range(5):  # two ranks, each step in a "train/rollout" stage, on two hosts
        now += 1.0
        for dp in (0, 1):
            proc = ProcessId(f"node-{dp}", 4000 + dp, f"a1b2c3d4e5{dp}", "01000000", f"w{dp}")
            tracker.heard("r", "actor", Rank(dp=dp), 2, now)
            tracker.heartbeat(Heartbeat("r", "actor", World(dp=2), (RankBeat(
                Rank(dp=dp), (OpenSpan("train", now - 0.6), OpenSpan("rollout", now - 0.5)),
                step),), now, False, 1.0, None, proc), now)
        tracker.finalized("r", "actor", step, now)
    lost = now
    for _ in range(12):  # dp=1 falls silent (two heartbeats: 10 s); dp=0 heartbeats on
        now += 1.0
        tracker.heartbeat(Heartbeat("r", "actor", World(dp=2), (RankBeat(
            Rank(dp=0), (), 4),), now, False, 1.0, None, ProcessId("node-0", 4000)), now)
    view = tracker.view("r", "actor", now)
    assert view is not None
    assert [(s.rank, s.stage, s.host, s.node, s.heard, s.last_step) for s in view.last_seen] \
        == [(Rank(dp=1), "train/rollout", "node-1", "a1b2c3d4e51", lost, 4)]
    clock = sim_clock(now)
    service = ServiceCore(Settings.model_validate({"notifiers": {"console": {"enabled": False}}}),
                          state_dir=tmp_path / "state", clock=clock)
    try:
        service.liveness([view])
        record = replace(_record(5, (Rank(dp=1),)), ranks_expected=2, ranks_reporting=1,
                         finalized_at=now + 3.0)
        firing = [e for e in service.publish([record]) if e.alert == "RankMissing"]
        assert [e.state for e in firing] == ["firing"]
        assert firing[0].detail.startswith(
            "Missing dp=1 (1 of 2 ranks) from step 5 on. Last heard: dp=1 in train/rollout on "
            "node-1 (Ray node a1b2c3d4), 15 s before, after step 4. To change: ")
        # dp=1 heard again: its old whereabouts are not said of a later step without it
        service.liveness([replace(view, last_seen=())])
        whole = replace(_record(6, ()), ranks_expected=2, ranks_reporting=2, finalized_at=now + 4)
        assert [e.state for e in service.publish([whole]) if e.alert == "RankMissing"] == [
            "resolved"]
        (again,) = [e for e in service.publish([replace(record, step=7)])
                    if e.alert == "RankMissing"]
        assert again.state == "firing" and "Last heard" not in again.detail
        # a rank the views never named missing: no whereabouts are made up
        (other,) = AlertEngine([r for r in default_rules() if r.name == "RankMissing"]).evaluate(
            _record(5, (Rank(dp=3),)))
        assert "Last heard" not in other.detail
    finally:
        service.close(0.0)
