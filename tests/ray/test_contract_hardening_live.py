"""Contract hardening (issue 11), live side: the aggregator and the collector tier validate what
replay validates, with the same checks. A bad message is rejected whole, counted and named; a
good one in the same batch is kept and delivered; the deadline pass and closing keep working."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlmon.actors.aggregator_actor import AggregatorServer
from rlmon.service.aggregation.aggregator import AggregatorCore
from rlmon.service.aggregation.aggregator_stats import AggregatorStats
from rlmon.service.aggregation.node_merge import NodeMerger
from rlmon.service.contract.acks import AddOutcome
from rlmon.service.contract.records import MAX_METRICS
from rlmon.service.contract.step_message import Columns, Schema, StepMessage, columns_from_states
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.metrics.partial import Partial
from rlmon.service.metrics.rank import Rank, World
from rlmon.service.metrics.spec import Form
from tests.support.polling import PATIENCE_S, wait_for

_GOOD = columns_from_states({"actor/loss": (Form.MEAN, (2.0, 1.0))})
_HUGE = 10**5000


def msg(**overrides: Any) -> StepMessage:
    fields: dict[str, Any] = dict(run="r", role="actor", step=0, rank=Rank(), world=World(),
                                  seq=1, time=0.0, columns=_GOOD)
    fields.update(overrides)
    return StepMessage(**fields)


def _many(n: int) -> Columns:
    return columns_from_states({f"user/m{i}": (Form.SUM, (1.0,)) for i in range(n)})


def _partials(n: int) -> tuple[tuple[int, dict[str, Partial]], ...]:
    return ((0, {f"user/p{i}": Partial(Form.SUM, (1.0,)) for i in range(n)}),)


# (bad message, the field its error names)
BAD: list[tuple[Any, str]] = [
    (None, ""),
    ("not a message", ""),
    (msg(rank={"dp": 0}), "rank"),
    (msg(world=None), "world"),
    (msg(world=World(dp="2")), "world.dp"),  # type: ignore[arg-type]
    (msg(world=World(dp=2.5), rank=Rank()), "world.dp"),  # type: ignore[arg-type]
    (msg(rank=Rank(dp=0.5), world=World(dp=2)), "rank.dp"),  # type: ignore[arg-type]
    (msg(rank=Rank(dp=True), world=World(dp=2)), "rank.dp"),
    (msg(world=World(dp=1 << 21, cp=1 << 21)), "world.dp"),
    (msg(world=World(dp=1 << 20, cp=1 << 20)), "world"),
    (msg(step=_HUGE), "step"),
    (msg(step=1.5), "step"),
    (msg(seq=_HUGE), "seq"),
    (msg(time=math.nan), "time"),
    (msg(rank=Rank(dp=_HUGE)), "rank.dp"),
    (msg(columns=[1.0, 2.0, 3.0]), "metrics"),
    (msg(columns="abc"), "metrics"),
    (msg(columns=Columns(_GOOD.schema, "abc")), "metrics"),  # type: ignore[arg-type]
    (msg(columns=Columns(_GOOD.schema, [[2.0, 1.0, 0.0]])), "metrics"),  # type: ignore[arg-type]
    (msg(columns=Columns(_GOOD.schema, np.array([["a", "b", "c"]]))), "metrics"),
    (msg(columns=Columns(Schema(("actor/loss",), (Form.MEAN,), 12345, 1, 0),
                         _GOOD.values)), "metrics"),
    (msg(columns=columns_from_states({"actor/loss": (Form.MEAN, (2.0, math.nan))})),
     "metrics.actor/loss"),
    (msg(columns=columns_from_states({"actor/loss": (Form.MEAN, (2.0, math.inf))})),
     "metrics.actor/loss"),
    (msg(columns=columns_from_states({"user/s": (Form.MOMENTS, (math.inf, 1.0, 1.0))})),
     "metrics.user/s"),
    (msg(columns=columns_from_states({"user/a": (Form.SQSUM, (math.nan,)),
                                      "user/b": (Form.SQSUM, (-1.0,))})), "metrics.user/b"),
    (msg(columns=columns_from_states({"user/a": (Form.MEAN, (1.0, 1.0)),
                                      "user/b": (Form.MEAN, (1.0, -1.0))})), "metrics.user/b"),
    (msg(columns=None, partials=((0, {"user/v": Partial(Form.SUM, "1.0")}),)), "metrics.user/v"),
    (msg(columns=None, partials=((0, {"user/v": Partial(Form.SUM, ("1.0",))}),)),
     "metrics.user/v"),
    (msg(columns=None, partials=((0, {"user/v": Partial(Form.MEAN, (1.0, math.nan))}),)),
     "metrics.user/v"),
    (msg(columns=None, partials=((0, {"user/v": Partial(Form.MEAN, (1.0, math.inf))}),)),
     "metrics.user/v"),
    (msg(columns=None, partials=((0, {"user/v": Partial(Form.SUM, (float(_HUGE % 7), 1.0))}),)),
     "metrics.user/v"),
    (msg(columns=None, partials=((0, {"user/v": Partial(Form.SUM, (10**400,))}),)),
     "metrics.user/v"),
    (msg(columns=None, partials=((0, {"user/v": Partial("sum", (1.0,))}),)),  # type: ignore[arg-type]
     "metrics.user/v"),
    (msg(columns=None, partials=((0, {"user/v": Partial(Form.SUM, (1.0,), frozenset({"ep"}))}),)),
     "metrics.user/v.replicated"),
    (msg(columns=None, partials=((0.5, {"user/v": Partial(Form.SUM, (1.0,))}),)), "minibatch"),
    (msg(columns=None, partials=[None]), "metrics"),
    (msg(columns=None, partials="x"), "metrics"),
    (msg(columns=None, partials=((0, {3: Partial(Form.SUM, (1.0,))}),)), "metrics"),
    (msg(columns=_many(150_000)), "metrics"),
    (msg(columns=_many(60_000), partials=_partials(60_000)), "metrics"),
]
IDS = [f"{i}-{field or 'message'}" for i, (_, field) in enumerate(BAD)]


def _good() -> StepMessage:
    return msg(run="ok", step=0)


def _check_error(error: str, field: str) -> None:
    assert len(error) < 400
    if field:
        assert f": {field}: " in error, error
    else:
        assert "StepMessage" in error or "malformed message" in error, error


@pytest.mark.parametrize(("bad", "field"), BAD, ids=IDS)
def test_aggregator_rejects_a_bad_message_whole_counts_it_and_keeps_the_good_one(
    bad: Any, field: str,
) -> None:
    core = AggregatorCore()
    ack = core.ingest([bad, _good()])
    assert (ack.rejected, ack.accepted) == (1, 1)
    assert core.counters.rejected == 1
    _check_error(ack.errors[0], field)
    (record,) = core.pending_records()
    assert record.run == "ok" and record.metrics["actor/loss"] == 2.0
    assert core.tick() == 0 and core.finalize_all() == 0  # nothing of the bad one was kept
    assert not core.assembler.open


@pytest.mark.parametrize(("bad", "field"), BAD[:12], ids=IDS[:12])
def test_the_good_message_beside_a_bad_one_is_delivered(bad: Any, field: str) -> None:
    published: list[StepRecord] = []

    def publish(records: list[StepRecord], shard: int, stats: AggregatorStats) -> None:
        published.extend(records)

    server = AggregatorServer(AggregatorCore(), publish, tick_s=0.01).start()
    try:
        # an open step of a good run, finalized by the deadline pass or at close
        open_step = msg(run="open", step=0, rank=Rank(dp=0), world=World(dp=2))
        ack = server.ingest([open_step, bad, _good()])
        assert (ack.rejected, ack.accepted) == (1, 2)
        wait_for(lambda: any(r.run == "ok" for r in published), PATIENCE_S, "the good step delivered")
    finally:
        assert server.close()
    runs = sorted(r.run for r in published)
    assert runs == ["ok", "open"]


def test_ranks_zero_and_one_half_do_not_complete_a_two_rank_step() -> None:
    core = AggregatorCore()
    world = World(dp=2)
    ack = core.ingest([msg(rank=Rank(dp=0), world=world), msg(rank=Rank(dp=0.5), world=world)])  # type: ignore[arg-type]
    assert (ack.accepted, ack.rejected) == (1, 1)
    assert not core.pending_records()
    assert core.finalize_all() == 1
    (record,) = core.pending_records()
    assert not record.complete and [r.dp for r in record.missing_ranks] == [1]


def test_integral_floats_and_numpy_integers_are_taken_as_integers() -> None:
    core = AggregatorCore()
    ack = core.ingest([
        msg(step=np.int64(3), rank=Rank(dp=0), world=World(dp=2.0)),  # type: ignore[arg-type]
        msg(step=3.0, rank=Rank(dp=np.int32(1)), world=World(dp=2)),  # type: ignore[arg-type]
    ])
    assert (ack.accepted, ack.rejected) == (2, 0), ack.errors
    (record,) = core.pending_records()
    assert record.step == 3 and type(record.step) is int
    assert record.complete and record.ranks_expected == 2
    assert record.metrics["actor/loss"] == 4.0 / 2.0


def test_an_infinite_count_can_no_longer_hide_a_loss() -> None:
    core = AggregatorCore()
    world = World(dp=2)
    bad = msg(rank=Rank(dp=1), world=world,
              columns=columns_from_states({"actor/loss": (Form.MEAN, (0.0, math.inf))}))
    ack = core.ingest([msg(rank=Rank(dp=0), world=world), bad])
    assert ack.rejected == 1
    core.finalize_all()
    (record,) = core.pending_records()
    assert record.metrics["actor/loss"] == 2.0  # not 2 / inf = 0.0


def test_the_metric_cap_is_the_contracts() -> None:
    core = AggregatorCore()
    ack = core.ingest([msg(columns=_many(MAX_METRICS)),
                       msg(step=1, columns=_many(MAX_METRICS // 2),
                           partials=_partials(MAX_METRICS // 2 + 1))])
    assert (ack.accepted, ack.rejected) == (1, 1)
    assert "more than 100000 metrics" in ack.errors[0]


def test_a_ranks_message_after_its_own_final_one_is_late() -> None:
    core = AggregatorCore()
    world = World(dp=2)
    ack = core.ingest([msg(rank=Rank(dp=0), world=world, seq=1),
                       msg(rank=Rank(dp=0), world=world, seq=2)])
    assert (ack.accepted, ack.late) == (1, 1)
    core.ingest([msg(rank=Rank(dp=1), world=world, seq=1)])
    (record,) = core.pending_records()
    assert record.metrics["actor/loss"] == 4.0 / 2.0  # rank 0's second message not folded


def test_a_step_in_an_old_gap_is_rejected_by_the_aggregator_not_late() -> None:
    core = AggregatorCore()
    for step in range(1, 2 * 4096 + 200, 2):
        core.ingest([msg(step=step, seq=step)])
    ack = core.ingest([msg(step=2, seq=2)])
    assert (ack.rejected, ack.late, ack.accepted) == (1, 0, 0)
    assert "step 2 of r/actor is older than the steps still tracked" in ack.errors[0]
    assert core.counters.late == 0
    ack = core.ingest([msg(step=2 * 4096 + 100, seq=2)])
    assert ack.accepted == 1 and ack.finalized == 1


# ---- the node-merge tier: the same checks, before anything is merged ------------------------------


@pytest.mark.parametrize(("bad", "field"), BAD, ids=IDS)
def test_collector_rejects_a_bad_message_and_forwards_the_good_one(bad: Any, field: str) -> None:
    root, node = AggregatorCore(), NodeMerger()
    ack = node.ingest([bad, _good()])
    assert (ack.rejected, ack.accepted) == (1, 1)
    assert node.rejected == 1
    _check_error(ack.errors[0], field)
    batch = node.next_batch()
    assert batch is not None
    assert batch.rejected == 1  # what the node merger refused reaches the root's counters
    merged = root.merge_batch(batch)
    assert (merged.accepted, merged.rejected) == (1, 0)
    assert root.counters.rejected == 1
    (record,) = root.pending_records()
    assert record.run == "ok" and record.metrics["actor/loss"] == 2.0


def test_collector_takes_a_ranks_message_after_its_final_one_as_late() -> None:
    node = NodeMerger()
    world = World(dp=2)
    assert node.add(msg(rank=Rank(dp=0), world=world, seq=1))
    assert not node.add(msg(rank=Rank(dp=0), world=world, seq=2))
    assert node.late == 1


def test_the_aggregator_rejects_a_state_in_an_old_gap() -> None:
    root = AggregatorCore()
    for step in range(1, 2 * 4096 + 200, 2):
        root.ingest([msg(step=step, seq=step)])
    node = NodeMerger()
    node.add(msg(step=2, seq=2))
    batch = node.next_batch()
    assert batch is not None
    ack = root.merge_batch(batch)
    assert ack.rejected == 1 and root.counters.late == 0
    assert root.assembler.add_message(msg(step=4 * 4096, seq=9))[0] == AddOutcome.ACCEPTED


_ANY = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**30), 10**30) | st.floats() | st.text(max_size=4)
    | st.just(10**400) | st.builds(Rank, st.integers(-2, 2)) | st.builds(World, st.integers(0, 3)),
    lambda inner: st.lists(inner, max_size=3) | st.tuples(inner, inner)
    | st.dictionaries(st.text(max_size=3), inner, max_size=2),
    max_leaves=6,
)
_FIELDS = ["run", "role", "step", "rank", "world", "seq", "time", "columns", "partials",
           "dropped", "started"]


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(_FIELDS), _ANY)
def test_any_value_in_any_message_field_never_breaks_ingest(field: str, value: Any) -> None:
    core, node = AggregatorCore(), NodeMerger()
    odd = msg(**{field: value})
    ack = core.ingest([odd, _good()])
    assert ack.accepted + ack.rejected == 2 and ack.accepted >= 1
    assert any(r.run == "ok" for r in core.pending_records())
    core.tick()
    core.finalize_all()
    node_ack = node.ingest([odd, _good()])
    assert node_ack.accepted + node_ack.rejected == 2
    batch = node.next_batch()
    assert batch is not None
    root = AggregatorCore()
    root.merge_batch(batch)
    root.finalize_all()
    assert any(r.run == "ok" for r in root.pending_records())


def test_a_form_mismatch_in_a_messages_partials_is_counted_as_rejected() -> None:
    core = AggregatorCore()
    bad = msg(columns=None, partials=((0, {"actor/loss": Partial(Form.SUM, (1.0,))}),))
    ack = core.ingest([bad, _good()])
    assert (ack.rejected, ack.accepted) == (1, 1)
    assert "metrics.actor/loss" in ack.errors[0]
    assert core.counters.rejected == 1
