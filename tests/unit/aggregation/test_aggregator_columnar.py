"""The aggregator's columnar hot path, the collector tier and the durable watermark agree with
the core: the same step records, bit for bit, whatever path the partials took."""

from __future__ import annotations

import math
import random
from pathlib import Path

import numpy as np
import pytest

from rlmon.service.aggregation.aggregator import AggregatorCore
from rlmon.service.aggregation.assembly import StepAssembler
from rlmon.service.aggregation.deadline import DeadlinePolicy
from rlmon.service.aggregation.node_merge import NodeMerger
from rlmon.service.aggregation.tier_messages import NodeBatch
from rlmon.service.aggregation.watermark import WatermarkStore
from rlmon.service.contract.step_message import StepMessage, columns_from_states
from rlmon.service.metrics.partial import ALL_AXES, Partial
from rlmon.service.metrics.rank import World
from rlmon.service.metrics.spec import Form
from tests.support.clock import FakeClock

_PLAIN = {
    "actor/loss": Form.MEAN, "rollout/tokens": Form.SUM, "actor/is_ratio_min": Form.MIN,
    "actor/is_ratio_max": Form.MAX, "actor/grad_norm": Form.SQSUM,
    "actor/advantage_std": Form.MOMENTS, "user/x": Form.MEAN,
}


def _state(rng: random.Random, form: Form, exact: bool) -> tuple[float, ...]:
    def num() -> float:
        if rng.random() < 0.02:
            return math.nan
        return rng.randint(-64, 64) / 8 if exact else rng.uniform(-5, 5)

    if form is Form.MEAN:
        return (num(), float(rng.randint(0, 9)))
    if form is Form.MOMENTS:
        return (float(rng.randint(0, 9)), num(), abs(num()))
    if form is Form.SQSUM:
        return (abs(num()),)
    return (num(),)


def _messages(seed: int, world: World, steps: int, exact: bool = False) -> list[StepMessage]:
    rng = random.Random(seed)
    out = []
    for step in range(steps):
        for seq, rank in enumerate(world.ranks()):
            states = {n: (f, _state(rng, f, exact)) for n, f in _PLAIN.items() if rng.random() < 0.9}
            partials = {
                "actor/lr": Partial(Form.VALUE, (1e-6, 1e-6), ALL_AXES),
                "rollout/reward": Partial(Form.MEAN, (3.0, 4.0), frozenset({"cp"})),
                "perf/step_seconds": Partial(Form.MAX, (rng.uniform(0.5, 2),)),
            }
            mb = {"user/mb": Partial(Form.MEAN, _state(rng, Form.MEAN, exact), None, True)}
            out.append(StepMessage(
                "run", "actor", step, rank, world, step * 100 + seq, 0.0,
                columns_from_states(states) if states else None,
                ((0, partials), (1 + seq % 2, mb)),
            ))
    return out


def _same(a: dict[str, float], b: dict[str, float]) -> bool:
    return a.keys() == b.keys() and all(
        (math.isnan(a[k]) and math.isnan(b[k])) or a[k] == b[k] for k in a)


@pytest.mark.parametrize("seed", range(5))
def test_columnar_merge_is_the_core_bit_for_bit(seed: int) -> None:
    world = World(dp=3, cp=2)
    msgs = _messages(seed, world, steps=4)
    random.Random(seed).shuffle(msgs)
    fast, core = StepAssembler(), StepAssembler()
    fast_records, core_records = [], []
    for msg in msgs:
        _, rec = fast.add_message(msg)
        fast_records += [rec] if rec else []
        for report in msg.reports():
            _, rec = core.add(report)
            core_records += [rec] if rec else []
    assert len(fast_records) == len(core_records) == 4
    fast_by = {r.step: r for r in fast_records}
    for rec in core_records:
        mine = fast_by[rec.step]
        assert _same(dict(mine.metrics), dict(rec.metrics)), rec.step
        assert mine.complete
        assert mine.missing_ranks == rec.missing_ranks
    assert fast.counters.partials == core.counters.partials


def test_resent_message_is_a_duplicate_and_conflicting_forms_are_rejected() -> None:
    from rlmon.service.contract.records import ContractError

    world = World(dp=2)
    msgs = _messages(1, world, steps=1)
    asm = StepAssembler()
    asm.add_message(msgs[0])
    assert asm.add_message(msgs[0])[0] == "duplicate"
    bad = StepMessage("run", "actor", 0, msgs[1].rank, world, 999, 0.0,
                      columns_from_states({"actor/loss": (Form.MAX, (1.0,))}))
    with pytest.raises(ContractError, match="actor/loss"):
        asm.add_message(bad)
    _, record = asm.add_message(msgs[1])
    assert record is not None
    assert record.complete


@pytest.mark.parametrize("seed", range(3))
def test_node_merge_tier_gives_identical_results(seed: int) -> None:
    """Two node mergers pre-merge half the ranks each; the root merges their states.
    Values are dyadic so that any summation order is exact and equality is exact."""
    world = World(dp=4, cp=2)
    msgs = _messages(seed, world, steps=3, exact=True)
    direct = StepAssembler()
    want = {}
    for msg in msgs:
        _, rec = direct.add_message(msg)
        if rec:
            want[rec.step] = rec
    nodes = [NodeMerger(), NodeMerger()]
    for msg in msgs:
        nodes[msg.rank.dp % 2].add(msg)
    nodes[0].add(msgs[0])  # a resend to a node merger is ignored
    root = AggregatorCore()
    for node in nodes:
        root.merge_batch(NodeBatch(node.drain()))
    got = {r.step: r for r in root.pending_records()}
    assert sorted(got) == sorted(want) == [0, 1, 2]
    for step, rec in want.items():
        assert _same(dict(got[step].metrics), dict(rec.metrics))
        assert got[step].complete
    assert nodes[0].duplicates == 1


def test_watermark_survives_a_restart(tmp_path: Path) -> None:
    """Finalized steps are not finalized again after a restart; undelivered records survive."""
    world = World(dp=2)
    msgs = _messages(3, world, steps=3)
    db = tmp_path / "watermark-0.sqlite"
    core = AggregatorCore(store=WatermarkStore(db))
    core.ingest(msgs[:4])  # steps 0 and 1 complete
    core.ingest(msgs[4:5])  # step 2 half open
    first = core.pending_records()
    assert [r.step for r in first] == [0, 1]
    core.delivered(first[:1])  # the service acknowledged step 0 only
    core.store.close()  # type: ignore[union-attr]
    # "restart": a new core on the same file; the reporters resend everything unacknowledged
    again = AggregatorCore(store=WatermarkStore(db))
    assert [r.step for r in again.pending_records()] == [1]  # redelivered, not recomputed
    ack = again.ingest(msgs)
    assert ack.late == 4
    assert ack.finalized == 1
    assert [r.step for r in again.pending_records()] == [1, 2]
    assert again.counters.steps_finalized == 1


def test_deadline_finalizes_a_missing_rank_and_follows_the_step_period() -> None:
    clock = FakeClock(0.0)
    policy = DeadlinePolicy(factor=3.0, floor=0.5, initial=10.0)
    core = AggregatorCore(deadline=policy, clock=clock)
    world = World(dp=2)
    # rank 1 reports steps 0 and 1 with rank 0, then dies
    msgs = [m for m in _messages(4, world, steps=6) if m.rank.dp == 0 or m.step < 2]
    for step in range(6):
        core.ingest([m for m in msgs if m.step == step])
        clock.advance(1.0)
    assert policy(run="run", role="actor") == pytest.approx(3.0)
    assert core.tick() == 2  # now = 6: steps 2 and 3 waited their 3 s
    clock.advance(10)
    assert core.tick() == 2
    records = core.pending_records()
    assert [r.step for r in records] == [0, 1, 2, 3, 4, 5]
    assert [r.complete for r in records] == [True, True, False, False, False, False]
    assert all(len(r.missing_ranks) == 1 for r in records if not r.complete)


def test_a_rank_never_heard_from_gets_the_initial_deadline() -> None:
    """Ranks start at their own pace: until each was heard once, a step waits the initial
    deadline, not the one the step period gives."""
    clock = FakeClock(0.0)
    policy = DeadlinePolicy(factor=3.0, floor=0.5, initial=10.0)
    core = AggregatorCore(deadline=policy, clock=clock)
    msgs = [m for m in _messages(4, World(dp=2), steps=4) if m.rank.dp == 0]
    for m in msgs:
        core.ingest([m])
        clock.advance(1.0)
    assert core.tick() == 0  # now = 4: 3 s past, but rank 1 was never heard from
    clock.now = 10.0
    assert core.tick() == 1  # step 0 waited its initial 10 s
    clock.now = 20.0
    assert core.tick() == 3
    assert all(not r.complete for r in core.pending_records())


def test_column_order_does_not_matter() -> None:
    a = columns_from_states({"actor/loss": (Form.MEAN, (1.0, 2.0)), "rollout/tokens": (
        Form.SUM, (3.0,))})
    b = columns_from_states({"rollout/tokens": (Form.SUM, (3.0,)), "actor/loss": (
        Form.MEAN, (1.0, 2.0))})
    assert a.schema == b.schema
    assert np.array_equal(a.values, b.values)
