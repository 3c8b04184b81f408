"""What the service keeps is bounded: the history store's retention, the per-stream state in
memory (expiry, a cap, read back from history when a stream returns), and a soak of one simulated
hour with new runs and new metric names arriving all the time, in which memory and disk stay flat.
No Ray; a simulated clock, but for the live path with the default clocks."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from rlmon.service.aggregation.aggregator import AggregatorCore
from rlmon.service.aggregation.stream_tracker import StreamTracker
from rlmon.service.config import Settings
from rlmon.service.contract.records import parse_report
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.metrics import catalog
from rlmon.service.service_core import ServiceCore
from rlmon.service.storage.history import HistoryStore
from tests.support.clock import FakeClock
from tests.support.records import step_record

IS_RATIO = catalog.get("actor/is_ratio").name
T0 = 1_700_000_000.0


def step(run: str, n: int, at: float, role: str = "actor", **metrics: float) -> StepRecord:
    return step_record(run=run, role=role, step=n, metrics=metrics or {IS_RATIO: 1.0},
                       finalized_at=at)


def settings(**retention: float) -> Settings:
    return Settings.model_validate({"notifiers": {"console": {"enabled": False}},
                                    "retention": retention})


def test_history_keeps_the_newest_steps_per_stream_and_drops_quiet_runs(tmp_path: Path) -> None:
    store = HistoryStore(tmp_path / "h.sqlite")
    store.add([step("old", n, T0 + n) for n in range(5)])
    store.add([step("new", n, T0 + 100 * 86_400 + n) for n in range(10)])
    store.add([step("new", n, T0 + 100 * 86_400 + n, role="rollout") for n in range(3)])
    pruned = store.prune(keep_steps=4, quiet_before=T0 + 30 * 86_400)
    assert pruned.runs == ("old",)
    assert pruned.steps == 5 + 6  # the quiet run whole, and the crowded stream's oldest six
    assert [s["step"] for s in store.steps("new", "actor")] == [6, 7, 8, 9]
    assert [s["step"] for s in store.steps("new", "rollout")] == [0, 1, 2]
    assert store.steps("old") == []
    assert store.prune(keep_steps=4, quiet_before=T0).steps == 0  # nothing more to do
    store.close()


def test_a_live_step_is_stamped_in_wall_time_so_retention_keeps_it(tmp_path: Path) -> None:
    """With the default clocks (no simulated time): the aggregator's finalized_at is unix time,
    the clock retention's 30 days are measured on. (It once was the monotonic clock, so every step
    looked decades old and a service running a minute wiped its history.)"""
    core = AggregatorCore()
    _, record = core.assembler.add(parse_report({
        "run": "live", "role": "actor", "step": 0, "rank": {"dp": 0}, "world": {"dp": 1},
        "metrics": {IS_RATIO: {"sum": 1.0, "count": 1}}}))  # the only rank: final at once
    assert record is not None and record.finalized_at is not None
    assert abs(record.finalized_at - time.time()) < 60
    assert len(core.assembler.finalize_latency) == 1 and core.assembler.finalize_latency[0] < 60
    # the service as it runs: retention every 1 ms of its (real) clock, each publish past it
    service = ServiceCore(settings(every_seconds=0.001), state_dir=tmp_path)
    for n in range(4):  # each publish takes over 1 ms: retention runs at every one after the first
        service.publish([replace(record, step=n)])
    assert service.spine.memory.removed["history_runs"] == 0
    assert [s["step"] for s in service.history.steps("live")] == [0, 1, 2, 3]
    service.close()


def test_stream_tracker_expires_quiet_and_finished_streams_and_caps_the_rest() -> None:
    tracker = StreamTracker(ttl=100.0, finished_ttl=10.0, max_streams=2)
    assert tracker.seen(("a", "actor"), 0.0).streams == []
    tracker.seen(("b", "actor"), 1.0)
    crowded = tracker.seen(("c", "actor"), 2.0)  # the least recently seen leaves
    assert (crowded.streams, crowded.runs) == ([("a", "actor")], ["a"])
    tracker.finish("b", 5.0)
    gone = tracker.expire(20.0)
    assert (gone.streams, gone.runs) == ([("b", "actor")], ["b"])
    assert tracker.expire(101.0).streams == []
    assert tracker.expire(102.0).streams == [("c", "actor")]
    assert len(tracker) == 0 and tracker.runs == 0
    assert (tracker.evicted_total, tracker.expired_total) == (1, 2)


def test_a_stream_back_from_expiry_resumes_its_alert_state(tmp_path: Path) -> None:
    clock = FakeClock(T0)
    core = ServiceCore(settings(stream_ttl_seconds=60, every_seconds=1), state_dir=tmp_path,
                       clock=clock)
    try:
        (fired,) = core.publish([step("r", 0, clock.now, **{IS_RATIO: 3.0})])
        assert fired.state == "firing"
        clock.now += 120  # quiet for longer than the TTL: the stream leaves memory
        core.publish([step("other", 0, clock.now)])
        assert ("r", "actor") not in core.spine.memory.tracker
        assert not any(key[0] == "r" for key in core.spine.judge.engine.states)
        assert core.spine.memory.removed["streams_forgotten"] == 1
        # restored, it resolves after the rule's good steps in a row (hysteresis), counted on
        (resolved,) = core.publish([step("r", n, clock.now, **{IS_RATIO: 1.0})
                                    for n in range(1, catalog.RESOLVE_AFTER + 1)])
        assert (resolved.alert, resolved.state) == ("ISRatioDivergence", "resolved")
    finally:
        core.close()
