"""Goodput accounting on synthetic timelines with known buckets: several ranks, a straggler, an
idle trainer, tied rewards, truncated completions, a nested checkpoint, an unknown span and a
discarded step; every bucket exact to the microsecond against a painted numpy reference and
against hand-computed figures."""

from __future__ import annotations

import math

import pytest

from rlmon.service.contract.timeline import RankTimeline, Span, Timeline
from rlmon.service.goodput.accounting import (
    GoodputTotals,
    RoleTimelines,
    StepInput,
    account_step,
    mfu,
)
from rlmon.service.goodput.buckets import DEFAULT_SPANS, Activity, Bucket, SpanMap
from rlmon.service.metrics.rank import Rank
from tests.support.goodput_scenario import CLIPPED, FRAC_ZERO_STD, reference, step_input
from tests.support.paths import REPO

US = 1e-6  # one microsecond: the tolerance


def _assert_equal(got: dict, want: dict) -> None:
    keys = set(got) | set(want)
    for key in sorted(keys, key=str):
        assert got.get(key, 0.0) == pytest.approx(want.get(key, 0.0), abs=US), key


def test_every_bucket_matches_the_painted_reference() -> None:
    data = step_input()
    result = account_step(data, SpanMap())
    _assert_equal(dict(result.seconds), reference(data))
    assert result.unmapped == ("my_thing",)
    assert result.ranks == {"rollout": 2, "reward": 1, "actor": 4}
    assert result.gpus == {"rollout": 4.0, "reward": 1.0, "actor": 4.0}


def test_hand_computed_figures() -> None:
    s = account_step(step_input(), SpanMap()).seconds
    a, r, w = "actor", "rollout", "reward"
    # three trainer ranks wait for the straggler's last 50.018 ms
    assert s[(a, Bucket.IDLE, "straggler")] == pytest.approx(3 * 0.050018, abs=US)
    # every trainer rank waits 400.116 ms for the rollouts (the slower engine's generate)
    assert s[(a, Bucket.IDLE, "rollouts")] == pytest.approx(4 * 0.400116, abs=US)
    # the faster engine waits 100.022 ms for the slower one: 2 GPUs each
    assert s[(r, Bucket.IDLE, "straggler")] == pytest.approx(2 * 0.100022, abs=US)
    # both engines wait for weights while the trainer updates (500.003 .. 900.011 ms, and the
    # straggler's last 12 us after their own weight sync ended)
    assert s[(r, Bucket.IDLE, "weights")] == pytest.approx(2 * 2 * (0.400008 + 0.000012), abs=US)
    # the checkpoint nested two deep in rank 0's update is overhead, not training
    assert s[(a, Bucket.OVERHEAD, "checkpoint")] == pytest.approx(0.030018, abs=US)
    assert s[(a, Bucket.PRODUCTIVE, "train")] == pytest.approx(
        3 * 0.400008 + 0.450026 - 0.030018, abs=US)
    gen = 2 * (0.400116 + 0.300094)
    assert s[(r, Bucket.WASTED, "no_reward_spread")] == pytest.approx(gen * FRAC_ZERO_STD, abs=US)
    assert s[(r, Bucket.WASTED, "truncated")] == pytest.approx(
        gen * (1 - FRAC_ZERO_STD) * CLIPPED, abs=US)
    assert s[(w, Bucket.PRODUCTIVE, "other")] == pytest.approx(0.009668, abs=US)


def test_buckets_add_up_to_every_ranks_time() -> None:
    result = account_step(step_input(), SpanMap())
    step_seconds = 1.000003
    want = {"rollout": 2 * 2 * step_seconds, "reward": step_seconds, "actor": 4 * step_seconds}
    for role, total in want.items():
        assert result.total(role=role) == pytest.approx(total, abs=US)
    assert 0 < result.goodput < 1


def test_a_discarded_step_wastes_its_productive_and_overhead_time() -> None:
    data = step_input(6, discarded="optimizer step skipped")
    result = account_step(data, SpanMap())
    _assert_equal(dict(result.seconds), reference(data))
    assert result.total(Bucket.PRODUCTIVE) == 0 and result.total(Bucket.OVERHEAD) == 0
    kept = account_step(step_input(5), SpanMap())
    assert result.total(Bucket.IDLE) == pytest.approx(kept.total(Bucket.IDLE), abs=US)
    assert result.total(Bucket.WASTED) == pytest.approx(
        kept.total(Bucket.PRODUCTIVE) + kept.total(Bucket.OVERHEAD)
        + kept.total(Bucket.WASTED), abs=US)


def test_run_totals_and_goodput() -> None:
    totals = GoodputTotals()
    first, second = (account_step(step_input(s, d), SpanMap())
                     for s, d in ((5, ""), (6, "skipped")))
    totals.add(first)
    totals.add(second)
    assert totals.steps == 2
    assert totals.total() == pytest.approx(first.total() + second.total(), abs=US)
    assert totals.goodput == pytest.approx(
        first.total(Bucket.PRODUCTIVE) / (first.total() + second.total()))
    assert sum(totals.by_reason().values()) == pytest.approx(totals.total(), abs=US)


def test_config_override_and_unmapped_bucket() -> None:
    data = step_input()
    spans = SpanMap({"my_thing": "logging"})
    result = account_step(data, spans)
    _assert_equal(dict(result.seconds), reference(data, spans))
    assert result.seconds[("reward", Bucket.OVERHEAD, "logging")] == pytest.approx(0.009668,
                                                                                  abs=US)
    assert result.unmapped == ()
    overhead = account_step(data, SpanMap(unmapped=Bucket.OVERHEAD))
    assert overhead.seconds[("reward", Bucket.OVERHEAD, "other")] == pytest.approx(0.009668,
                                                                                 abs=US)
    with pytest.raises(ValueError, match=r"goodput\.spans\.x: unknown activity 'lunch'"):
        SpanMap({"x": "lunch"})
    with pytest.raises(ValueError, match="unmapped_bucket"):
        SpanMap(unmapped=Bucket.IDLE)


def test_framework_names_match_with_prefixes_and_case() -> None:
    spans = SpanMap()
    assert spans.activity("timing_s/update_actor") is Activity.TRAIN
    assert spans.activity("profiling/Time taken: GRPOTrainer.vLLM.generate") is Activity.GENERATE
    assert spans.activity("GRPOTrainer.sync_weights") is Activity.WEIGHT_SYNC
    assert spans.activity("bwd_allreduce_microstep") is Activity.TRAIN
    assert spans.activity("step") is Activity.STEP
    assert spans.activity("nobody-knows") is Activity.OTHER


def test_a_rollout_engine_waits_for_the_previous_steps_weights() -> None:
    """The engine's step starts while the trainer still updates its previous step: that
    trainer step, a neighbour, says why the engine waited."""
    ns = 1_000_000
    engine = RoleTimelines("rollout", (RankTimeline(Rank(), Timeline(
        0, 100 * ns, (Span("generate", 60 * ns, 100 * ns),))),))
    trainer_prev = RoleTimelines("actor", (RankTimeline(Rank(), Timeline(
        -50 * ns, 40 * ns, (Span("train", -10 * ns, 40 * ns),))),))
    alone = account_step(StepInput("r", 0, 1, (engine,)), SpanMap())
    assert alone.seconds[("rollout", Bucket.IDLE, "unattributed")] == pytest.approx(0.060)
    paired = account_step(StepInput("r", 0, 1, (engine,), neighbours=(trainer_prev,)),
                          SpanMap())
    assert paired.seconds[("rollout", Bucket.IDLE, "weights")] == pytest.approx(0.040)
    assert paired.seconds[("rollout", Bucket.IDLE, "unattributed")] == pytest.approx(0.020)


def test_a_rank_without_spans_is_all_idle_and_mfu() -> None:
    one = RoleTimelines("actor", (RankTimeline(Rank(), Timeline(0, 2_000_000_000)),), 8.0)
    result = account_step(StepInput("r", 0, 0, (one,)), SpanMap())
    assert result.seconds == {("actor", Bucket.IDLE, "unattributed"): pytest.approx(16.0)}
    assert math.isnan(result.goodput) is False and result.goodput == 0.0
    assert mfu(1_000, 6e9, 10.0, 1e12) == pytest.approx(0.6)
    assert math.isnan(mfu(1, 1, 0.0, 1e12))


def test_spans_that_overlap_without_nesting_match_the_reference() -> None:
    """Spans of two threads of one rank overlap without nesting: the deepest span wins, then
    the later start (the painted fallback), as the reference paints them."""
    us = 1_000

    def rank(dp: int, spans: list[tuple[str, int, int, int]]) -> RankTimeline:
        return RankTimeline(Rank(dp=dp), Timeline(0, 1_000 * us, tuple(
            Span(n, s * us, e * us, d) for n, s, e, d in spans)))

    trainer = RoleTimelines("actor", (
        rank(0, [("train", 100, 600, 0), ("checkpoint", 500, 700, 0), ("log", 550, 560, 1),
                 ("update_weights", 650, 800, 1)]),
        rank(1, [("train", 100, 900, 0)]),
    ))
    engine = RoleTimelines("rollout", (rank(0, [("generate", 0, 90, 0)]),))
    data = StepInput("r", 0, 0, (trainer, engine), 0.5, 0.0)
    result = account_step(data, SpanMap())
    _assert_equal(dict(result.seconds), reference(data))
    # the checkpoint wins over train (same depth, later start) except under the nested spans
    assert result.seconds[("actor", Bucket.OVERHEAD, "checkpoint")] == pytest.approx(
        ((550 - 500) + (600 - 560) + (650 - 600)) * 1e-6, abs=US)


def test_the_docs_page_lists_the_default_map() -> None:
    page = (REPO / "docs" / "goodput.md").read_text(encoding="utf-8")
    rows = {line.split("|")[1].strip(): line for line in page.splitlines()
            if line.startswith("| ") and "→" in line}
    assert rows, "docs/goodput.md has no map table"
    for framework, name, activity in DEFAULT_SPANS:
        assert any(line.split("|")[1].strip() == framework and f"`{name}`" in line
                   and f"{activity.value} →" in line
                   for line in page.splitlines() if line.startswith("| ")), (framework, name)
