"""Level shifts and whole-step jitter are not slides (issue 39's quiet healthy runs,
:mod:`rlmon.service.alerting.level_shift`): a jump that settles or recedes short of the level
rule's level holds an early warning back; a ramp, a jump that moves on, a jump to the level
rule's level and a lag that grows past what it reached still fire."""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest

from rlmon.service.alerting import level_shift
from rlmon.service.alerting.engine import AlertEngine
from rlmon.service.alerting.rules import default_rules
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.metrics import catalog as c

# the early warning and its level rule (the hold needs the level rule in the pack)
_LENGTH = ("ResponseLengthRunaway", "CompletionsTruncated")


def _firings(names: tuple[str, ...], metric: str, values: list[float],
             other: dict[str, float] | None = None) -> list[tuple[str, int]]:
    engine = AlertEngine([r for r in default_rules() if r.name in names])
    out = []
    for step, value in enumerate(values):
        record = StepRecord("r", "rollout", step, True, 1, 1, (), {metric: value, **(other or {})})
        out += [(e.alert, e.step) for e in engine.evaluate(record) if e.state == "firing"]
    return out


def _noisy(level: float, n: int, sd: float, seed: int) -> np.ndarray:
    return level * np.exp(sd * np.random.default_rng(seed).standard_normal(n))


@pytest.mark.parametrize("seed", range(4))
def test_a_length_that_jumps_and_holds_is_not_a_runaway(seed: int) -> None:
    """A switch to harder prompts: the mean length 40 % longer at once, then steady."""
    values = _noisy(400, 200, 0.03, seed)
    values[120:] *= 1.4
    assert _firings(_LENGTH, c.RESPONSE_LENGTH, values.tolist()) == []


@pytest.mark.parametrize("seed", range(4))
def test_a_reward_that_drops_at_once_and_recovers_is_not_a_collapse(seed: int) -> None:
    rng = np.random.default_rng(seed)
    t = np.arange(300)
    values = 0.6 + 0.02 * rng.standard_normal(300)
    after = t >= 150
    values[after] -= 0.35 * np.exp(-(t[after] - 150) / 80)
    assert _firings(("RewardCollapsing", "RewardStuck"), c.REWARD, values.tolist()) == []


@pytest.mark.parametrize("seed", range(4))
def test_a_ramp_still_fires_as_soon_as_before(seed: int) -> None:
    """A length running away a few percent a step: held back nowhere (the engine without the
    hold fires at the same step)."""
    values = _noisy(400, 200, 0.03, seed)
    values[120:] *= np.exp(0.05 * np.arange(1, 81))
    fired = _firings(_LENGTH, c.RESPONSE_LENGTH, values.tolist())
    assert fired and 120 <= fired[0][1] <= 128
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(level_shift, "hold", lambda *args: None)
        assert _firings(_LENGTH, c.RESPONSE_LENGTH, values.tolist()) == fired


def test_a_jump_that_then_runs_away_fires_once_it_moves_on() -> None:
    """Held back while the jump holds still; the runaway after it fires within a few steps,
    and without the level rule in the pack nothing is held back."""
    values = _noisy(400, 220, 0.03, 7)
    values[120:] *= 1.4
    values[160:] *= np.exp(0.05 * np.arange(1, 61))
    fired = _firings(_LENGTH, c.RESPONSE_LENGTH, values.tolist())
    assert fired and 160 <= fired[0][1] <= 170
    alone = _firings(("ResponseLengthRunaway",), c.RESPONSE_LENGTH, values.tolist())
    assert alone and alone[0][1] <= 122


def test_a_jump_to_the_level_rules_level_fires_at_once() -> None:
    """KL jumping to 3 (over KLDivergence's 2) is not held back: it is named at its third
    step, where both rules judge it first (KLClimbing takes three steps however far out), by
    the level rule, which speaks for the early warning while it fires."""
    values = _noisy(0.1, 120, 0.05, 3)
    values[80:] = 3.0 * values[80:] / 0.1
    fired = _firings(("KLClimbing", "KLDivergence"), c.KL, values.tolist())
    assert fired[0] == ("KLDivergence", 82), fired
    alone = _firings(("KLClimbing",), c.KL, values.tolist())
    assert alone[0] == ("KLClimbing", 82), alone


def test_a_jittering_lag_is_not_growth_and_a_growing_one_fires() -> None:
    """A queue's lag of 2 that reaches 3 or 4 on a third of the steps: never above what its
    window saw; a lag that grows a step a step past it fires 2 steps in."""
    rng = np.random.default_rng(11)
    jitter = (2 + (rng.random(400) < 0.3) * rng.integers(1, 3, 400)).astype(float)
    assert _firings(("PolicyLagGrowing",), c.POLICY_LAG, jitter.tolist()) == []
    growing = jitter[:100].tolist() + [4.0 + k for k in range(1, 30)]
    fired = _firings(("PolicyLagGrowing",), c.POLICY_LAG, growing)
    assert fired and 100 < fired[0][1] <= 103


def test_the_shift_is_judged_from_the_window_before_it() -> None:
    params = next(r for r in default_rules() if r.name == "ResponseLengthRunaway").baseline
    history = deque([400.0, 404.0, 398.0, 401.0, 399.0, 403.0, 397.0, 400.0, 402.0, 398.0,
                     560.0, 566.0, 558.0])
    shift = level_shift.level_shift(params, history, held_steps=2, step=12)
    assert shift is not None and shift.step_in > level_shift.JUMP
    ramp = deque([400.0, 404.0, 398.0, 401.0, 399.0, 403.0, 397.0, 400.0, 402.0, 398.0,
                  415.0, 430.0, 447.0, 465.0])
    assert level_shift.level_shift(params, ramp, held_steps=2, step=13) is None
    # the episode goes on against the level before it: held while it stays, not once it runs
    assert level_shift.hold(params, deque([*history, 562.0]), 3, 13, shift) is not None
    assert level_shift.hold(params, deque([*history, 700.0, 720.0, 740.0]), 5, 15,
                            shift) is None
