"""The detection benchmark's simulator and scoring on one seed: a healthy run fires nothing, and
each gradual fault is caught, by the early-warning pack sooner than by the thresholds alone."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np

from rlmon.service.rules import default_rules, fixed_rules

ROOT = Path(__file__).resolve().parents[1]


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
