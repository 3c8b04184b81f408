"""The detection benchmark's simulator and scoring on one seed: a healthy run fires nothing, and
each gradual fault is caught, by the early-warning pack sooner than by the thresholds alone."""

from __future__ import annotations

import importlib.util
import math
import sys
from types import ModuleType

import numpy as np
import pytest

from rlmon.service.alerting.rules import default_rules, fixed_rules
from tests.support.paths import REPO

ROOT = REPO


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_detection",
                                                  ROOT / "bench" / "bench_detection.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


bench = _bench()
SEED = 7000  # neither a tuning nor a held-out seed


def test_healthy_run_stays_in_the_guide_ranges_and_fires_nothing() -> None:
    series, _ = bench.healthy_run(SEED, 300)
    assert series["actor/logp_diff"].max() < 0.1
    assert series["actor/entropy"].min() > 0.01 and series["actor/kl"].max() < 2.0
    assert series["rollout/frac_reward_zero_std"].max() < 0.8
    assert bench.firings(bench.Case(SEED, 300), default_rules()) == []


def test_every_gradual_fault_is_caught_earlier_with_the_early_warning_rules() -> None:
    results = [(case, bench.firings(case, default_rules()))
               for case in (bench.fault_case(SEED, fault, "gradual") for fault in bench.FAULTS)]
    fixed = bench.score(results, {r.name for r in fixed_rules()})
    early = bench.score(results, {r.name for r in default_rules()})
    for fault in bench.FAULTS:
        [with_early] = early.delays[(fault, "gradual")]
        [alone] = fixed.delays[(fault, "gradual")]
        assert with_early is not None, fault
        assert alone is None or with_early < alone, fault
    assert early.early == 0  # nothing before the onsets


def test_sensitivity_scales_only_the_early_warning_decisions() -> None:
    half = {r.name: r for r in bench.pack(0.5)}
    for rule in default_rules():
        if rule.condition == "baseline":
            assert half[rule.name].baseline.decision == rule.baseline.decision / 2
        else:
            assert half[rule.name] == rule
    ramp = bench._progress(10, 3, 4)
    assert np.allclose(ramp, [0, 0, 0, 0.25, 0.5, 0.75, 1, 1, 1, 1])


def test_noise_parts_left_out_keep_the_rest_of_the_run() -> None:
    full, _ = bench.healthy_run(SEED, 300)
    same, _ = bench.healthy_run(SEED, 300, bench.NOISE)
    trend, _ = bench.healthy_run(SEED, 300, frozenset())
    wander, _ = bench.healthy_run(SEED, 300, frozenset({"wander"}))
    assert all(np.array_equal(full[k], same[k]) for k in full)
    # the same draws: what no noise part touches is the same run
    assert np.array_equal(trend["rollout/policy_lag"], full["rollout/policy_lag"])
    # the noise-free entropy is the run's trend: it only falls; the noisy one does not
    assert np.all(np.diff(trend["actor/entropy"]) <= 0)
    assert np.any(np.diff(full["actor/entropy"]) > 0)
    # the wander is slow: the step-to-step changes of the wander-only run are the smaller ones
    assert (np.abs(np.diff(np.log(wander["actor/kl"]) - np.log(trend["actor/kl"]))).mean()
            < np.abs(np.diff(np.log(full["actor/kl"]) - np.log(trend["actor/kl"]))).mean())


def test_the_bound_cusum_needs_two_steps_over_like_the_product() -> None:
    z = np.zeros((3, 40))
    z[0, 30] = 1e6  # one spike, however large: the clip keeps it from firing
    z[1, 30:32] = 1e6  # two in a row fire
    z[2, 30:33] = 1e6
    one = bench._alarms(z, 2.0, 4.0, 1)
    assert not one[0].any() and one[1, 31] and not one[1, 30]
    two = bench._alarms(z, 2.0, 4.0, 2)
    assert not two[1, 31] and two[2, 32]  # held for two steps: one step later
    assert not bench._alarms(z, 2.0, 4.0, 1)[:, :bench.BOUND_WARMUP].any()


def test_the_perfect_baseline_bound_on_one_seed() -> None:
    case = bench.fault_case(SEED, "kl_blowup", "gradual")
    z = bench._oracle_z(SEED, case.steps, "kl_blowup", frozenset(), case)
    healthy = bench._oracle_z(SEED, case.steps, "kl_blowup", frozenset())
    assert np.array_equal(z[:case.onset], healthy[:case.onset])  # the fault starts at its onset
    assert z[case.onset + case.ramp - 1] > 20  # and ends far above the run's noise
    mean, (allowance, decision, for_steps) = bench._bound_one(
        ("cusum", "kl_blowup", frozenset(), [SEED], 0))
    assert 0 <= mean <= case.ramp
    assert allowance in bench.BOUND_ALLOWANCES and decision in bench.BOUND_DECISIONS
    # the setting it found is quiet on the seed's healthy runs
    runs = [bench._oracle_z(c.seed, c.steps, "kl_blowup", frozenset())
            for c in bench.cases([SEED]) if c.fault is None]
    assert not bench._alarms(bench._padded(runs), allowance, decision, for_steps).any()


def test_the_ramp_statistic_is_the_matched_filter_over_every_recent_onset() -> None:
    rng = np.random.default_rng(3)
    z = rng.standard_normal((2, bench.BOUND_WARMUP + 15)) * 3
    z[1, -4:] = np.nan  # a shorter run, padded
    window, cap = 4, 2.5
    got = bench._ramp_statistic(z, window, cap)
    for row in range(2):
        for t in range(bench.BOUND_WARMUP, z.shape[1]):
            if np.isnan(z[row, t]):
                assert got[row, t] == -np.inf
                continue
            clipped = np.minimum(z[row], cap)
            want = max(
                sum((j + 1) * clipped[t - back + j] for j in range(back + 1))
                / math.sqrt(sum((j + 1) ** 2 for j in range(back + 1)))
                for back in range(window))
            assert got[row, t] == pytest.approx(want)
    assert (got[:, :bench.BOUND_WARMUP] == -np.inf).all()


def test_the_ramp_bound_never_fires_on_one_step_and_catches_a_ramp_early() -> None:
    z = np.zeros((2, 60))
    z[0, 40] = 1e6  # one spike, however large
    z[1, 40:] = 0.8 * np.arange(1, 21)  # a ramp of 0.8 SD a step
    for window, cap, decision, for_steps in [(5, 4.0, 4.5, 1), (8, 6.0, 8.0, 2)]:
        fired = bench._held(bench._ramp_statistic(z, window, cap) >= decision, for_steps)
        assert not fired[0].any()
        assert fired[1].any() and 40 < fired[1].argmax() <= 40 + 8
    settings = [s for s, _, _ in bench._ramp_family(z[:1], z[1:])]
    assert settings and all(cap < decision for _, cap, decision, _ in settings)
