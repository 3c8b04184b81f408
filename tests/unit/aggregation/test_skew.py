"""No false pages under skew: a rank that is alive but behind is waited for; a dead one is not.

Simulated time (an injected clock), so a 128-rank run of 40 steps costs milliseconds and the
verdicts do not depend on how loaded the test machine is.
"""

from __future__ import annotations

import heapq
import random
from pathlib import Path

import pytest

from rlmon.actors.reporter import Reporter
from rlmon.service.aggregation.aggregator import AggregatorCore
from rlmon.service.aggregation.watermark import WatermarkStore
from rlmon.service.contract.step_message import StepMessage, columns_from_states
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.metrics.rank import Rank, World
from rlmon.service.metrics.spec import Form
from tests.support.clock import FakeClock
from tests.support.sinks import AggregatorSink

RANKS = 128
PERIOD = 0.5  # seconds between steps: 3 x period is below the 2 s floor


def _msg(step: int, dp: int) -> StepMessage:
    cols = columns_from_states({"actor/loss": (Form.MEAN, (1.0, 1.0))})
    return StepMessage("skew", "actor", step, Rank(dp=dp), World(dp=RANKS), step + 1, 0.0, cols)


def _simulate(lag_of: dict[int, float], steps: int, dead: dict[int, int] | None = None,
              seed: int = 0) -> list[StepRecord]:
    """Every rank sends step s at s * PERIOD + its lag (+ jitter); ranks in ``dead`` stop at
    their step. The aggregator ticks every 20 ms of simulated time."""
    rng = random.Random(seed)
    clock = FakeClock(0.0)
    core = AggregatorCore(clock=clock, wall_clock=clock)  # simulated time
    events: list[tuple[float, int, int]] = []
    for step in range(steps):
        for dp in range(RANKS):
            if dead and dp in dead and step >= dead[dp]:
                continue
            at = step * PERIOD + lag_of.get(dp, 0.05) + rng.uniform(0.0, 0.1)
            heapq.heappush(events, (at, step, dp))
    end = steps * PERIOD + 700.0
    while clock.now < end:
        while events and events[0][0] <= clock.now:
            _, step, dp = heapq.heappop(events)
            core.ingest([_msg(step, dp)])
        core.tick()
        if not events and not core.assembler.open:
            break
        clock.advance(0.02)
    core.finalize_all()
    return sorted(core.pending_records(limit=10_000), key=lambda r: r.step)


@pytest.mark.parametrize("seed", range(3))
def test_two_ranks_behind_by_more_than_the_floor_never_page_as_missing(seed: int) -> None:
    records = _simulate({126: 2.6, 127: 3.1}, steps=40, seed=seed)
    assert len(records) == 40
    false_missing = [r.step for r in records if not r.complete]
    assert false_missing == []


def test_a_rank_falling_further_behind_while_alive_is_still_waited_for() -> None:
    lags = {127: 0.0}
    # rank 127 slows down: each step it is 0.1 s further behind (6 s behind at step 59)
    rng_lags = {dp: 0.05 for dp in range(RANKS)}
    rng_lags.update(lags)
    records: list[StepRecord] = []
    clock = FakeClock(0.0)
    core = AggregatorCore(clock=clock)
    events = sorted((step * PERIOD + (0.1 * step if dp == 127 else 0.05), step, dp)
                    for step in range(60) for dp in range(RANKS))
    for at, step, dp in events:
        while clock.now < at:
            core.tick()
            clock.advance(0.02)
        core.ingest([_msg(step, dp)])
    core.finalize_all()
    records = core.pending_records(limit=10_000)
    assert len(records) == 60 and all(r.complete for r in records)


def test_a_dead_rank_is_still_reported_missing_within_seconds() -> None:
    records = _simulate({126: 2.6}, steps=30, dead={5: 10})
    missing = [r.step for r in records if not r.complete]
    assert missing == list(range(10, 30))
    assert all(Rank(dp=5) in r.missing_ranks for r in records if not r.complete)
    first = next(r for r in records if r.step == 10)
    assert first.finalized_at is not None and first.first_seen is not None
    # it waits a few step periods for the dead rank, never the 600 s ceiling
    assert first.finalized_at - first.first_seen < 10.0


def test_resends_after_an_aggregator_restart_are_counted_as_resent_not_late(
        tmp_path: Path) -> None:
    db = tmp_path / "watermark-0.sqlite"
    sink = AggregatorSink(AggregatorCore(store=WatermarkStore(db)))
    reps = [Reporter("resend", "actor", rank={"dp": i}, world={"dp": 2}, sink=sink,
                     step_seconds=False) for i in range(2)]
    for step in range(3):
        for rep in reps:
            if rep.rank.dp == 1 and step == 0:
                continue  # rank 1 never sends step 0: it stays open, steps 1 and 2 finalize
            rep.record("rollout/tokens", sum=1.0)
            rep.end_step(step)
    assert all(rep.flush(30) for rep in reps)
    assert [r.step for r in sink.core.pending_records()] == []  # held behind open step 0
    sink.core = AggregatorCore(store=WatermarkStore(db))  # restart: open step 0 is lost
    assert reps[0].flush(30)
    counters = sink.core.counters
    # steps 1 and 2 were folded in before: resent, never late. Rank 1 still holds its steps 1
    # and 2 too (step 0 is open) and resends them if its own probe comes round meanwhile
    assert counters.late == 0 and counters.resent in (2, 4)
    assert reps[0].resent >= 3
    for rep in reps:
        rep.close()
