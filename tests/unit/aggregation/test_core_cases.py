"""The exact cases of the metric-core issue, plus step assembly behaviour."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from rlmon.service.aggregation.assembly import StepAssembler
from rlmon.service.contract.acks import AddOutcome
from rlmon.service.contract.records import ContractError, parse_report
from rlmon.service.metrics.rank import Rank
from rlmon.service.replay import replay


def rec(step: int = 0, dp: int = 0, cp: int = 0, world: dict[str, int] | None = None,
        **fields: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"run": "r", "role": "actor", "step": step, "rank": {"dp": dp, "cp": cp},
                           "world": world or {"dp": 2}}
    out.update(fields)
    return out


def lines(*records: dict[str, Any]) -> list[str]:
    return [json.dumps(r) for r in records]


def only_step(records: list[dict[str, Any]]) -> dict[str, float]:
    result = replay(lines(*records))
    assert not result.errors, result.errors
    (record, _), = result.steps
    return dict(record.metrics)


def test_token_weighted_loss_is_not_mean_of_rank_means() -> None:
    got = only_step([
        rec(dp=0, metrics={"actor/loss": {"sum": 200, "count": 100}}),
        rec(dp=1, metrics={"actor/loss": {"sum": 300, "count": 300}}),
    ])
    assert got["actor/loss"] == pytest.approx(1.25, rel=1e-12)


def test_clip_ratio_pools_tokens() -> None:
    got = only_step([
        rec(dp=0, metrics={"actor/clip_ratio": {"sum": 3, "count": 12}}),
        rec(dp=1, metrics={"actor/clip_ratio": {"sum": 3, "count": 4}}),
    ])
    assert got["actor/clip_ratio"] == pytest.approx(0.375, rel=1e-12)


def test_cp_replicated_sum_counted_once_and_sharded_sum_counted_fully() -> None:
    world = {"dp": 2, "cp": 2}
    copies = {0: -14.00, 1: -14.43}
    records = [
        rec(dp=d, cp=c, world=world, metrics={
            "loss_sum": {"sum": copies[d], "replicated": ["cp"]},
            "sharded": {"sum": copies[d]},
        })
        for d in (0, 1) for c in (0, 1)
    ]
    got = only_step(records)
    assert got["loss_sum"] == pytest.approx(-28.43, rel=1e-12)
    assert got["sharded"] == pytest.approx(-56.86, rel=1e-12)


def test_replica_disagreement_raises_replica_mismatch() -> None:
    world = {"dp": 1, "cp": 2}
    result = replay(lines(
        rec(cp=0, world=world, metrics={"x": {"sum": 1.0, "replicated": ["cp"]}}),
        rec(cp=1, world=world, metrics={"x": {"sum": 1.1, "replicated": ["cp"]}}),
    ))
    (record, events), = result.steps
    assert record.replica_mismatches == ("x",)
    assert [e.alert for e in events] == ["ReplicaMismatch"]
    # agreement within 1e-6 relative is not a mismatch
    result = replay(lines(
        rec(cp=0, world=world, metrics={"x": {"sum": 1.0, "replicated": "all"}}),
        rec(cp=1, world=world, metrics={"x": {"sum": 1.0 + 1e-9, "replicated": "all"}}),
    ))
    assert result.steps[0][0].replica_mismatches == ()


def test_value_partials_must_agree_across_ranks() -> None:
    ok = only_step([rec(dp=d, metrics={"actor/lr": {"value": 1e-6}}) for d in (0, 1)])
    assert ok["actor/lr"] == 1e-6
    result = replay(lines(*(rec(dp=d, metrics={"actor/grad_norm": {"value": 1.0 + d}}) for d in (0, 1))))
    assert result.steps[0][0].replica_mismatches == ("actor/grad_norm",)


def test_skyrl_minibatch_mean_semantics() -> None:
    """Loss sums over micro-batches and DP ranks within a mini-batch, then a mean over mini-batches."""
    # mini-batch 0: two micro-batches per rank; mini-batch 1: one
    sums = {(0, 0): [1.0, 2.0], (0, 1): [3.0, 4.0], (1, 0): [10.0], (1, 1): [20.0]}
    records = []
    for (mb, dp), micro in sums.items():
        for u, value in enumerate(micro):
            records.append(rec(dp=dp, minibatch=mb, seq=mb * 10 + u,
                               final=(mb == 1 and u == len(micro) - 1),
                               metrics={"policy_loss": {"sum": value, "minibatch_reduce": "mean"}}))
    got = only_step(records)
    assert got["policy_loss"] == pytest.approx(((1 + 2 + 3 + 4) + (10 + 20)) / 2)


def test_silent_rank_at_end_of_input_is_missing_and_fires_rank_missing() -> None:
    world = {"dp": 4}
    result = replay(lines(*(rec(dp=d, world=world, metrics={"actor/loss": {"sum": 1.0, "count": 1}})
                            for d in (0, 1, 3))))
    (record, events), = result.steps
    assert not record.complete
    assert record.ranks_expected == 4
    assert record.ranks_reporting == 3
    assert record.missing_ranks == (Rank(dp=2),)
    line = record.to_json()
    assert line["missing_ranks"] == [{"dp": 2, "cp": 0, "tp": 0, "pp": 0}]
    assert [(e.alert, e.state, e.severity) for e in events] == [("RankMissing", "firing", "critical")]


def test_duplicates_by_seq_are_ignored_and_late_records_counted() -> None:
    asm = StepAssembler()
    a = parse_report(rec(dp=0, seq=1, final=False, metrics={"m": {"sum": 1.0}}))
    assert asm.add(a)[0] == AddOutcome.ACCEPTED
    assert asm.add(a)[0] == AddOutcome.DUPLICATE
    asm.add(parse_report(rec(dp=0, seq=2, metrics={"m": {"sum": 1.0}})))
    outcome, record = asm.add(parse_report(rec(dp=1, metrics={"m": {"sum": 5.0}})))
    assert outcome == AddOutcome.ACCEPTED
    assert record is not None
    assert record.metrics["m"] == 7.0
    late = asm.add(parse_report(rec(dp=1, seq=9, metrics={"m": {"sum": 100.0}})))
    assert late == (AddOutcome.LATE, None)
    assert asm.counters.duplicates == 1
    assert asm.counters.late == 1
    # a late record for step 0 is never folded into step 1
    asm.add(parse_report(rec(step=1, dp=0, metrics={"m": {"sum": 1.0}})))
    _, step1 = asm.add(parse_report(rec(step=1, dp=1, metrics={"m": {"sum": 1.0}})))
    assert step1 is not None
    assert step1.metrics["m"] == 2.0


def test_out_of_order_steps_and_alerts_in_step_order() -> None:
    # steps arrive 2, 0, 1; the 3-step ClipRatioHigh fires at step 2 whatever the arrival order
    records = [rec(step=s, dp=d, metrics={"actor/clip_ratio": {"sum": 4, "count": 10}})
               for s in (2, 0, 1) for d in (0, 1)]
    result = replay(lines(*records))
    assert [r.step for r, _ in result.steps] == [0, 1, 2]
    fired = [(e.step, e.alert) for e in result.alerts]
    assert fired == [(2, "ClipRatioHigh")]


def test_absent_is_not_zero() -> None:
    got = only_step([
        rec(dp=0, metrics={"actor/entropy": {"sum": 0.0, "count": 0}}),
        rec(dp=1, metrics={}),
    ])
    assert "actor/entropy" not in got


def test_nan_propagates_and_fires_non_finite() -> None:
    result = replay(lines(
        rec(dp=0, metrics={"actor/loss": {"sum": "NaN", "count": 10}}),
        rec(dp=1, metrics={"actor/loss": {"sum": 1.0, "count": 10}}),
    ))
    (record, events), = result.steps
    assert math.isnan(record.metrics["actor/loss"])
    assert record.to_json()["metrics"]["actor/loss"] is None
    assert record.to_json()["nonfinite"] == {"actor/loss": "NaN"}
    assert [(e.alert, e.metric) for e in events] == [("NonFiniteMetric", "actor/loss")]


def test_out_of_domain_fires() -> None:
    result = replay(lines(rec(world={"dp": 1}, metrics={"actor/entropy": {"sum": -1.0, "count": 2}})))
    assert [(e.alert, e.metric, e.value) for e in result.alerts] == [
        ("MetricOutOfDomain", "actor/entropy", -0.5)
    ]


def test_straggler_ratio_is_derived_from_per_rank_step_times() -> None:
    times = [1.0, 1.0, 1.1, 3.0]
    got = only_step([rec(dp=d, world={"dp": 4}, metrics={"perf/step_seconds": {"max": t}})
                     for d, t in enumerate(times)])
    assert got["perf/step_seconds"] == 3.0
    assert got["perf/straggler_ratio"] == pytest.approx(3.0 / 1.05)


def test_world_disagreement_and_form_clash_reject_the_record_only() -> None:
    asm = StepAssembler()
    asm.add(parse_report(rec(dp=0, metrics={"actor/loss": {"sum": 1.0, "count": 1}})))
    with pytest.raises(ContractError, match="world"):
        asm.add(parse_report(rec(dp=1, world={"dp": 3}, metrics={})))
    with pytest.raises(ContractError, match="actor/loss"):
        asm.add(parse_report(rec(dp=1, metrics={"actor/loss": {"sum": 1.0}})))
    with pytest.raises(ContractError, match="catalog"):
        asm.add(parse_report(rec(dp=1, metrics={"actor/lr": {"sum": 1.0}})))
    assert asm.counters.rejected == 3
    _, record = asm.add(parse_report(rec(dp=1, metrics={"actor/loss": {"sum": 3.0, "count": 1}})))
    assert record is not None
    assert record.metrics["actor/loss"] == 2.0


def test_finalized_steps_never_take_an_unseen_step_for_finalized() -> None:
    """Steps 1..4199 finalized, then step 0 arrives: it is new, not late."""
    asm = StepAssembler()
    for s in range(1, 4200):
        asm.add(parse_report(rec(step=s, world={"dp": 1}, metrics={"m": {"sum": 1.0}})))
    outcome, record = asm.add(parse_report(rec(step=0, world={"dp": 1}, metrics={"m": {"sum": 2.0}})))
    assert outcome == AddOutcome.ACCEPTED
    assert record is not None
    assert record.metrics["m"] == 2.0
    assert asm.finalized[("r", "actor")].floor == 4200
    assert asm.finalized[("r", "actor")].intervals() == []


def test_finalized_steps_memory_is_bounded_with_gaps() -> None:
    from rlmon.service.aggregation.finalized_steps import FinalizedSteps

    done = FinalizedSteps(limit=100)
    for s in range(0, 10_000, 2):  # every other step: a gap each time
        done.add(s + 1)
    assert len(done.intervals()) <= 100
    assert 9_999 in done
    assert 9_998 not in done  # recent gaps stay open
    assert 0 not in done  # step 0 never arrived and sits below everything: still open


def test_huge_world_lists_a_bounded_number_of_missing_ranks() -> None:
    """4M ranks expected, one reporting: the step names at most MAX_LISTED_MISSING of the missing
    ones (what that costs in time is measured by bench/bench_aggregator.py)."""
    from rlmon.service.aggregation.step_state import MAX_LISTED_MISSING

    result = replay(lines(rec(world={"dp": 1 << 20, "cp": 4}, metrics={"m": {"sum": 1.0}})))
    (record, _), = result.steps
    assert record.ranks_expected == 1 << 22
    assert record.ranks_reporting == 1
    assert len(record.missing_ranks) == MAX_LISTED_MISSING
    assert record.to_json()["missing_ranks_truncated"] is True
    too_big = replay(lines(rec(world={"dp": 1 << 20, "cp": 8}, metrics={})))
    assert "exceed the limit" in too_big.errors[0].error
