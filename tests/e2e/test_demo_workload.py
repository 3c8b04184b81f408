"""The demo's GRPO workload without Ray: its records go through the replay core and the default rules.

``rlmon demo --fault none`` must fire nothing (a new user's first look at rlmon is a healthy run),
and each fault must fire exactly its own alerts. The Ray demo computes exactly these numbers
(``tests/test_ray_demo.py`` runs it end to end), so this is where the alert sets are pinned.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from functools import cache
from typing import Any

import numpy as np
import pytest

from rlmon.service.metrics import catalog
from rlmon.service.replay import ReplayResult, replay
from rlmon.workload import grpo
from tests.support.paths import REPO

ROOT = REPO
FAULT_STEP = 3
slow = pytest.mark.slow


@cache
def _run(fault: str, steps: int, seed: int) -> ReplayResult:
    records = grpo.simulate(steps=steps, fault=fault, fault_step=FAULT_STEP,
                            config=grpo.GRPOConfig(seed=seed))
    result = replay([json.dumps(r) for r in records])
    assert not result.errors
    return result


def _fired(result: ReplayResult) -> dict[str, list[int]]:
    """Alert name -> the steps it fired at (an escalation or a re-send is not a firing)."""
    out: dict[str, list[int]] = {}
    for event in result.alerts:
        if event.state == "firing" and not event.escalated_from and not event.repeat:
            out.setdefault(event.alert, []).append(event.step)
    return out


def _series(result: ReplayResult, name: str) -> np.ndarray:
    values = {rec.step: rec.metrics[name] for rec, _ in result.steps if name in rec.metrics}
    return np.array([values[s] for s in sorted(values)])


@pytest.mark.parametrize("seed", [0, pytest.param(1, marks=slow), pytest.param(2, marks=slow)])
def test_healthy_run_fires_nothing_over_sixty_steps(seed: int) -> None:
    result = _run("none", 60, seed)
    assert len({rec.step for rec, _ in result.steps}) == 60
    assert _fired(result) == {}


def test_healthy_run_is_in_the_axolotl_guide_ranges() -> None:
    result = _run("none", 60, 0)
    clip = _series(result, "actor/clip_ratio")
    # several mini-batch updates per rollout: the policy moves within a step, so tokens clip
    assert 0.02 < clip.mean() < 0.2 and clip.max() < 0.3
    # responses end with EOS
    assert _series(result, "rollout/clipped_ratio").max() < 0.3
    lengths = _series(result, "rollout/response_length")
    assert lengths.min() > 3 and lengths.max() < grpo.GRPOConfig().max_len
    # a learning signal: groups with mixed rewards, and a reward that rises
    zero_std = _series(result, "rollout/frac_reward_zero_std")
    assert zero_std.mean() < 0.5 and zero_std.max() < 0.8
    reward = _series(result, "rollout/reward")
    assert reward[:10].mean() > 0.15 and reward[-10:].mean() > reward[:10].mean() + 0.1
    assert _series(result, "rollout/reward_std").min() > 0
    grad_norm = _series(result, "actor/grad_norm")
    assert grad_norm.min() > 0.001 and grad_norm.max() < 1.0
    assert _series(result, "actor/kl").max() < 0.5
    assert _series(result, "actor/entropy").min() > 0.5
    assert (_series(result, "actor/is_ratio") == 1.0).all()  # the rollout has the weights


@pytest.mark.parametrize("seed", [0, pytest.param(1, marks=slow), pytest.param(2, marks=slow)])
def test_stale_weights_fires_the_logprob_and_is_ratio_warnings(seed: int) -> None:
    result = _run("stale_weights", 30, seed)
    fired = _fired(result)
    # a warning whose value then crosses its critical level escalates: the same alert, one
    # escalation event, not a new firing (issue 30)
    escalations = [(e.alert, e.severity) for e in result.alerts if e.escalated_from]
    assert set(escalations) <= {("LogprobMismatch", "critical")}
    assert set(fired) == {"LogprobMismatch", "ISRatioStale", "PolicyLagGrowing"}
    # the rollout's weights stop moving: its lag grows by one a step, seen once the lag rule's
    # 20-step warm-up is over (its baseline is a level: a lag that keeps growing stays above it)
    assert fired["PolicyLagGrowing"][0] > 20
    # each fires once and stays firing: the drift only grows
    assert len(fired["LogprobMismatch"]) == 1 and len(fired["ISRatioStale"]) == 1
    assert FAULT_STEP < fired["LogprobMismatch"][0] <= FAULT_STEP + 5
    assert fired["LogprobMismatch"][0] < fired["ISRatioStale"][0] <= FAULT_STEP + 11


@pytest.mark.parametrize("seed", [0, pytest.param(1, marks=slow)])
def test_dead_rank_fires_rank_missing_only(seed: int) -> None:
    result = _run("dead_rank", 30, seed)
    assert _fired(result) == {"RankMissing": [FAULT_STEP]}
    actor = [rec for rec, _ in result.steps if rec.role == "actor"]
    assert [rec.ranks_reporting for rec in actor[FAULT_STEP - 1 : FAULT_STEP + 1]] == [4, 3]


@pytest.mark.parametrize("seed", [0, pytest.param(1, marks=slow), pytest.param(2, marks=slow)])
def test_lr_spike_fires_clip_ratio_high_only(seed: int) -> None:
    cfg = grpo.GRPOConfig(seed=seed)
    good = catalog.RESOLVE_AFTER  # the good steps in a row a firing rule waits to resolve
    result = _run("lr_spike", 30 + good, seed)
    lr = _series(result, "actor/lr")
    spiked = np.arange(len(lr))[lr > cfg.lr]
    assert list(spiked) == list(range(FAULT_STEP, FAULT_STEP + cfg.spike_steps))
    # the third spiked step completes ClipRatioHigh's three; it resolves once the spike is over
    # and RESOLVE_AFTER good steps followed (hysteresis)
    states = [(e.alert, e.state, e.step) for e in result.alerts]
    assert states[0] == ("ClipRatioHigh", "firing", FAULT_STEP + 2)
    assert {a for a, _, _ in states} == {"ClipRatioHigh"}
    assert [s for _, s, _ in states] == ["firing", "resolved"]  # one alert, not a flap
    assert states[-1][2] <= FAULT_STEP + cfg.spike_steps + 2 + good
    assert _series(result, "actor/clip_ratio")[FAULT_STEP : FAULT_STEP + 3].min() > 0.3


def test_unknown_fault_is_refused() -> None:
    with pytest.raises(ValueError, match="fault must be one of"):
        next(grpo.simulate(fault="meteor"))


@slow
def test_bundled_example_run_is_the_current_workload() -> None:
    """``rlmon demo --replay`` replays what ``python -m rlmon.workload.example`` writes today."""
    out = subprocess.run([sys.executable, "-m", "rlmon.workload.example"], capture_output=True,
                         text=True, check=True, timeout=120)
    bundled = (ROOT / "rlmon" / "data" / "example_run.jsonl").read_text()
    # Equal up to the last bits of a float: numpy's summation order differs between CPUs (SIMD
    # widths) and releases, which moves the 16th digit and nothing else.
    fresh = [json.loads(line) for line in out.stdout.splitlines()]
    assert _same_records(fresh, bundled)


def _same_records(fresh: list[Any], bundled: str) -> bool:
    def same(a: Any, b: Any) -> bool:
        if isinstance(a, dict) and isinstance(b, dict):
            return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
        if isinstance(a, list) and isinstance(b, list):
            return len(a) == len(b) and all(map(same, a, b))
        if isinstance(a, float) or isinstance(b, float):
            return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-15)
        return bool(a == b)
    expected = [json.loads(line) for line in bundled.splitlines()]
    return len(fresh) == len(expected) and all(map(same, fresh, expected))
