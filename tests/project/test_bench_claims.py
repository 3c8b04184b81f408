"""The claims benchmark (bench/bench_claims.py, bench/claims/): its scores count right, its
generated runs hold the truth they claim, each format reads back as written, and on a few seeds
of its fast mode rlmon's diff and projection sentences meet their targets."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bench.claims import KINDS, Score, register
from bench.claims import kinds as _kinds  # noqa: F401  (registers the kinds)
from bench.claims.formats import read, write
from bench.claims.kinds.alerts import claims_alerts
from bench.claims.runs import RunSpec, crossing, generate
from rlmon.service.diff.runs import from_logged

SEEDS = range(100, 104)


def test_scores_count_precision_recall_delay_and_coverage() -> None:
    score = Score("k")
    score.event(truth=True, said=True, right=True, delay=2)
    score.event(truth=True, said=True, right=False, delay=40, what="late")
    score.event(truth=True, said=False, right=False, what="missed")
    score.event(truth=False, said=True, right=False, what="false alarm")
    score.event(truth=False, said=False, right=False)
    assert (score.precision, score.recall) == (1 / 3, 1 / 3)
    assert score.delays == [2] and score.false_claims == 2 and score.negatives == 2
    assert score.misses == ["late", "missed", "false alarm"]
    score.range(low=5, high=15, truth=10)
    score.range(low=5, high=15, truth=20, what="run")
    assert score.coverage == 0.5 and score.widths == [1.0, 0.5]
    assert score.misses[-1] == "run range 5-15, truth 20"
    row = score.row()
    assert row["precision"] == "0.33 (1/3)" and row["coverage"] == "0.50 (1/2)"


def test_kinds_are_registered_once_by_name() -> None:
    assert {"diff.parting", "diff.parting.10x", "diff.silence", "projection.alert",
            "projection.end", "projection.silence", "finding.step", "finding.holds",
            "cost.total", "run.state", "alert.reward_hacking", "alert.escalation",
            "alert.healthy_quiet"} <= set(KINDS)
    with pytest.raises(ValueError, match="registered twice"):
        register("diff.parting", "again")(lambda seeds, fast: Score("x"))


def test_a_generated_fault_holds_the_truth_it_claims() -> None:
    spec = RunSpec(config=1, seed=3, steps=100, noise=0.0, fault="jump", metric="kl",
                   magnitude=1e6, onset=40)
    run = generate(spec)
    assert run.clean[40]["kl"] / generate(spec.healthy()).clean[40]["kl"] == pytest.approx(1e6)
    assert crossing(run, "kl", 2.0, down=False, after=0) == 40
    nan = generate(RunSpec(config=1, seed=3, steps=60, fault="nan", metric="grad_norm",
                           onset=30))
    assert math.isfinite(nan.rows[29]["grad_norm"]) and math.isnan(nan.rows[30]["grad_norm"])
    # two seeds of one config: the same levels, other noise
    a, b = generate(RunSpec(config=5, seed=1)), generate(RunSpec(config=5, seed=2))
    assert a.clean == b.clean and a.rows[10]["kl"] != b.rows[10]["kl"]


@pytest.mark.parametrize("fmt", ["tensorboard", "trainer-state", "rlmon-jsonl"])
def test_each_format_reads_back_what_was_written(tmp_path: Path, fmt: str) -> None:
    run = generate(RunSpec(config=2, seed=2, steps=30))
    series = from_logged(read(write(run, fmt, tmp_path)), fmt)
    kl = series.series["actor/kl"]
    assert sorted(kl) == list(range(1, 31))
    assert kl[7] == pytest.approx(run.rows[7]["kl"], rel=1e-6)  # float32 in TensorBoard


def test_fast_mode_diff_claims_meet_their_targets() -> None:
    big = KINDS["diff.parting.10x"].score(SEEDS, True)
    assert big.recall == 1.0 and big.precision == 1.0, big.misses
    assert max(big.delays) <= 5
    quiet = KINDS["diff.silence"].score(SEEDS, True)
    assert quiet.negatives >= len(SEEDS) and quiet.false_claims == 0, quiet.misses


def test_fast_mode_projections_hold_or_stay_silent() -> None:
    silent = KINDS["projection.silence"].score(SEEDS, True)
    assert silent.false_claims == 0, silent.misses
    end = KINDS["projection.end"].score(SEEDS, True)
    assert end.ranged >= 1 and end.coverage == 1.0, end.misses


def test_the_bench_prints_a_table_per_seed_set(capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "bench" / "bench_claims.py"
    spec = importlib.util.spec_from_file_location("bench_claims", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--fast", "--kinds", "projection.silence"]) == 0
    out = capsys.readouterr().out
    assert "tuning seeds 100-103:" in out and "held-out seeds 9100-9103:" in out
    assert out.count("| projection.silence |") == 2


def test_a_runs_stated_state_is_its_true_state() -> None:
    """Ten seeds: one run of each case (healthy, 10x slower, hung, one rank hung, a node lost,
    the driver killed, frozen, crashed, preempted, finished), each stated as what it is."""
    from bench.claims.kinds.run_state import TRUTH

    score = KINDS["run.state"].score(range(100, 100 + len(TRUTH)), True)
    assert score.positives == len(TRUTH) and score.recall == 1.0, score.misses
    assert score.precision == 1.0 and score.delays


def test_alert_claims_are_scored_case_by_case() -> None:
    """``bench/claims_alerts.py``'s claims in the registry: reward hacking named in time and
    never on healthy runs, escalations quoted right and priced once. Four seeds (14 hacks): on
    two (7) one hack named at 16 steps rather than 15 moved the recall by 0.14."""
    hacking = KINDS["alert.reward_hacking"].score(range(100, 104), True)
    assert hacking.positives >= 12 and hacking.negatives >= 4, hacking.misses
    assert not [m for m in hacking.misses if "without a hack" in m], hacking.misses
    assert hacking.recall is not None and hacking.recall >= 0.7, hacking.misses
    escalation = KINDS["alert.escalation"].score(range(9000, 9002), True)
    assert escalation.positives == 6 and escalation.recall == 1.0, escalation.misses


def test_a_healthy_run_s_warnings_are_false_claims() -> None:
    """The fast mode's healthy runs: one seed of each benign kind, 300 steps; every warning is
    counted as a false claim, and the notes give the rate per 1,000 steps."""
    quiet = KINDS["alert.healthy_quiet"].score([9100], True)
    assert quiet.negatives == 15 and quiet.positives == 0
    assert "warnings per 1,000 healthy steps (4,500 steps)" in quiet.notes
    assert quiet.false_claims <= 4, quiet.misses  # at most 1 per 1,000 steps


def test_fast_mode_every_heading_alert_states_where_it_is_heading() -> None:
    """Eight seeds of blow-ups heading for a level the rules page at: every early warning whose
    metric reaches it after the firing states its range while it holds (at the firing or a few
    steps after), and the range holds the crossing."""
    heading = KINDS["projection.alert"].score(range(100, 108), True)
    assert heading.positives >= 4 and heading.recall == 1.0, heading.misses
    assert heading.coverage == 1.0 and max(heading.delays) <= 10, heading.misses


def test_two_unseen_healthy_runs_that_notified_four_times_stay_within_three() -> None:
    """Seeds no session tuned on: two consecutive KL spikes, twice (kl_spikes 9408), and one
    small batch's token-mean logprob difference past 0.1 for a step, twice (small_batch 9406),
    each sent 4 notifications of one condition (two incidents, fired and resolved)."""
    runs = [*claims_alerts.healthy_runs([9408], kinds=("kl_spikes",)),
            *claims_alerts.healthy_runs([9406], kinds=("small_batch",))]
    assert [(r.kind, r.seed) for r in runs] == [("kl_spikes", 9408), ("small_batch", 9406)]
    assert max(r.worst for r in runs) <= 3, runs
