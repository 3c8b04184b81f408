"""A restarted aggregator keeps what it knew of each rank (issue 23, defect b): a step of a run
with a dead rank finalizes at its usual deadline, not after the 60 s start-up deadline."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from rlmon.service.aggregation.aggregator import AggregatorCore
from rlmon.service.aggregation.watermark import WatermarkStore
from tests.support.clock import FakeClock
from tests.unit.liveness.support import sim_clock, step_message


def _core(path: Path, clock: FakeClock) -> AggregatorCore:
    return AggregatorCore(store=WatermarkStore(path), clock=clock, wall_clock=clock.wall)


def _finalize_seconds(core: AggregatorCore, clock: FakeClock, step: int) -> float:
    """Seconds of simulated time until ``step`` finalizes (ticking every 0.1 s)."""
    waited = 0.0
    while not any(r.step == step for r in core.pending_records(10_000)):
        clock.advance(0.1)
        waited += 0.1
        core.tick()
        assert waited < 120, "never finalized"
    core.delivered(core.pending_records(10_000))
    return waited


def _scenario(path: Path, restart: bool) -> float:
    """Two ranks, one step a second; rank 1 dies at step 10; the aggregator restarts (or not)
    after step 12; returns how long step 13 waited."""
    clock = sim_clock()
    core = _core(path, clock)
    for step in range(10):
        core.ingest([step_message("r", step, 0, 2), step_message("r", step, 1, 2)])
        core.tick()
        core.delivered(core.pending_records(10_000))
        clock.advance(1.0)
    for step in range(10, 13):  # rank 1 died: steps finalize at the deadline without it
        core.ingest([step_message("r", step, 0, 2)])
        assert _finalize_seconds(core, clock, step) < 20
    clock.advance(1.0)
    core.tick()
    if restart:
        core = _core(path, clock)
    core.ingest([step_message("r", 13, 0, 2)])
    return _finalize_seconds(core, clock, 13)


def test_a_step_with_a_dead_rank_finalizes_at_its_deadline_after_a_restart(
        tmp_path: Path) -> None:
    kept = _scenario(tmp_path / "a.sqlite", restart=False)
    restarted = _scenario(tmp_path / "b.sqlite", restart=True)
    assert restarted <= kept + 1.0, f"step 13 waited {restarted:.1f}s after a restart, " \
        f"{kept:.1f}s without one"


def test_a_stream_that_left_memory_leaves_the_saved_liveness(tmp_path: Path) -> None:
    clock = sim_clock()
    store = WatermarkStore(tmp_path / "w.sqlite")
    core = AggregatorCore(store=store, clock=clock, wall_clock=clock.wall, stream_ttl=100.0)
    core.ingest([step_message("old", 0)])
    core.tick()
    assert ("old", "actor") in store.load_liveness()
    for _ in range(30):  # well past the stream TTL, another stream reporting
        clock.advance(10.0)
        core.ingest([step_message("new", _ + 1)])
        core.delivered(core.pending_records(100))
        core.tick()
    saved = store.load_liveness()
    assert ("old", "actor") not in saved and ("new", "actor") in saved


def test_a_rerun_after_a_restart_is_a_new_attempt_when_its_liveness_was_restored(
        tmp_path: Path) -> None:
    """A run that ended more than a stream TTL before the aggregator restarted comes back into
    memory with its saved liveness; rerun under the same name, its steps are the next attempt
    (found by the examples on a state directory an hour old: the service dropped every step of
    the rerun as a redelivery of the first attempt's)."""
    clock = sim_clock()
    store = WatermarkStore(tmp_path / "w.sqlite")
    core = AggregatorCore(store=store, clock=clock, wall_clock=clock.wall)
    for step in range(4):
        core.ingest([replace(step_message("q", step), started=clock.wall())])
        core.tick()
    assert [r.attempt for r in core.pending_records(100)] == [0, 0, 0, 0]
    core.delivered(core.pending_records(100))
    assert ("q", "actor") in store.load_liveness()
    clock.advance(2 * 3600.0)  # past the stream TTL: the restart does not load the stream
    again = AggregatorCore(store=WatermarkStore(tmp_path / "w.sqlite"), clock=clock,
                           wall_clock=clock.wall)
    again.ingest([replace(step_message("q", 0), started=clock.wall() - 5.0)])
    again.tick()
    assert [(r.step, r.attempt) for r in again.pending_records(100)] == [(0, 1)]
