"""RewardHacking: the reward climbing with the length and the KL off their own course,
or away from a verifier score, is named; healthy runs whose reward and length grow together
are not; the state survives a restart (saved in the history store) and the finding comes out of
``rlmon diagnose`` on a trainer_state.json written by transformers."""

from __future__ import annotations

import math
from collections import deque
from pathlib import Path

import numpy as np
import pytest

from rlmon.service.alerting import reward_hacking
from rlmon.service.alerting.engine import AlertEngine
from rlmon.service.alerting.rules import parse_rules, reward_hacking_rule
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.metrics import catalog as c

STEPS = 200


def run(seed: int, shape: str = "concave", hack_at: int | None = None, kind: str = "length",
        verifier: bool = False) -> list[dict[str, float]]:
    """A GRPO run's driver metrics: the reward learns (``shape``), the length follows it at the
    run's coupling, the KL grows from zero; from ``hack_at`` the reward hacking ``kind``."""
    rng = np.random.default_rng(seed)
    t = np.arange(STEPS, dtype=float)
    wander = np.zeros(STEPS)
    for i in range(1, STEPS):
        wander[i] = 0.95 * wander[i - 1] + 0.3 * rng.standard_normal()
    progress = {"concave": 1 - np.exp(-t / 80), "linear": t / STEPS,
                "sigmoid": 1 / (1 + np.exp(-(t - 100) / 20))}[shape]
    clean = 0.2 + 0.4 * progress
    reward = clean + 0.02 * (rng.standard_normal(STEPS) + wander)
    length = 300 * np.exp(1.0 * (clean - 0.2) + 0.02 * rng.standard_normal(STEPS))
    kl = (0.002 + 0.1 * progress) * np.exp(0.08 * rng.standard_normal(STEPS))
    score = clean + 0.02 * (wander + rng.standard_normal(STEPS))
    if hack_at is not None:
        p = np.clip((t - hack_at + 1) / 10, 0, 1)
        reward = reward + 0.3 * p
        if kind == "length":
            length, kl = length * np.exp(math.log(2.5) * p), kl * np.exp(math.log(3) * p)
    rows = []
    for i in range(STEPS):
        row = {c.REWARD: float(reward[i]), c.RESPONSE_LENGTH: float(length[i]),
               c.KL: float(kl[i]), c.ENTROPY: 0.4}
        if verifier:
            row[c.VERIFIER_SCORE] = float(score[i])
        rows.append(row)
    return rows


def fired(rows: list[dict[str, float]]) -> list[tuple[int, str]]:
    engine = AlertEngine([reward_hacking_rule()])
    out = []
    for step, metrics in enumerate(rows):
        out += [(e.step, e.detail) for e in engine.evaluate(
            StepRecord("r", "driver", step, True, 1, 1, (), metrics)) if e.state == "firing"]
    return out


@pytest.mark.parametrize("shape", ["concave", "linear", "sigmoid"])
def test_reward_and_length_growing_together_is_not_hacking(shape: str) -> None:
    for seed in range(4):
        assert fired(run(seed, shape, verifier=seed % 2 == 1)) == [], (shape, seed)


def test_reward_length_and_kl_climbing_together_is_named() -> None:
    for seed in range(4):
        found = fired(run(seed, "linear", hack_at=100))
        assert found, seed
        step, detail = found[0]
        assert 100 <= step <= 112, (seed, step)
        assert "response length x" in detail and "KL x" in detail
        # without a held-out score the signature is all there is: the detail says so
        assert "no verifier score logged" in detail


def test_a_reward_pulling_away_from_the_verifier_is_named() -> None:
    found = fired(run(3, "concave", hack_at=100, kind="gap", verifier=True))
    assert found and 100 <= found[0][0] <= 112
    assert "reward - verifier gap" in found[0][1]
    assert "no verifier score logged" not in found[0][1]
    # the same reward jump without a verifier, the length and the KL steady: not named
    assert fired(run(3, "concave", hack_at=100, kind="gap")) == []


def test_the_verifier_gap_is_judged_only_on_a_line_of_warmup_steps() -> None:
    """The gap's line ends ``gap_guard`` steps back, further than the others': at the first
    judged step (warmup + guard) it would be drawn through 25 steps of the run's steepest bend.
    It is judged once it has ``warmup`` steps of its own, as the others are from the start."""
    params = reward_hacking.RewardHackingParams()
    first_gap_step = min(params.warmup, params.window) + params.gap_guard
    history: deque[float] = deque()
    score = 0.0
    gaps = {}
    for step, metrics in enumerate(run(1, "concave", verifier=True)[:first_gap_step + 1]):
        score, found = reward_hacking.observe(params, history, score, metrics)
        if found is not None:
            gaps[step] = found.z_gap
    assert min(gaps) == min(params.warmup, params.window) + params.guard
    assert all(math.isnan(z) for step, z in gaps.items() if step < first_gap_step), gaps
    assert math.isfinite(gaps[first_gap_step])


def test_the_baseline_stays_pinned_until_the_alert_resolves() -> None:
    """While the rule's alert fires (``firing``) the steps since it fired are kept out of the
    baseline even on a step whose score fell under the decision; once it has resolved the
    window slides again."""
    params = reward_hacking.RewardHackingParams()
    rows = run(0, "linear", verifier=True)
    pinned: deque[float] = deque()
    for metrics in rows[:params.keep]:
        reward_hacking.observe(params, pinned, 0.0, metrics)
    slid = deque(pinned)
    for metrics in rows[params.keep:params.keep + 5]:
        score, _ = reward_hacking.observe(params, pinned, 0.0, metrics, firing=True)
        assert score < params.decision
        reward_hacking.observe(params, slid, 0.0, metrics, firing=False)
    assert len(pinned) == (params.keep + 5) * 4
    assert len(slid) == params.keep * 4
    reward_hacking.observe(params, pinned, 0.0, rows[params.keep + 5], firing=False)
    assert len(pinned) == params.keep * 4


def test_the_alert_names_what_to_check_and_resumes_after_a_restart(tmp_path: Path) -> None:
    from rlmon.service.storage.history import HistoryStore

    rows = run(1, "linear", hack_at=100)
    records = [StepRecord("r", "driver", s, True, 1, 1, (), m) for s, m in enumerate(rows)]
    whole = AlertEngine([reward_hacking_rule()])
    expected = [e for r in records for e in whole.evaluate(r)]
    assert expected[0].what_to_check == reward_hacking.WHAT_TO_CHECK
    first = AlertEngine([reward_hacking_rule()])
    got = [e for r in records[:95] for e in first.evaluate(r)]
    store = HistoryStore(tmp_path / "history.sqlite")
    try:
        store.add(records[:95], states=first.states, last_steps=first.last_step)
        second = AlertEngine([reward_hacking_rule()])
        second.states.update(store.alert_states())
        second.last_step.update(store.last_steps())
    finally:
        store.close()
    got += [e for r in records[95:] for e in second.evaluate(r)]
    assert [(e.step, e.state) for e in got] == [(e.step, e.state) for e in expected]


def test_a_rule_file_retunes_it() -> None:
    (rule,) = [r for r in parse_rules("rules: [{name: RewardHacking, decision: 12}]")
               if r.name == "RewardHacking"]
    assert rule.reward_hacking.decision == 12 and rule.reward_hacking.window == 40
    assert "off their own 40-step course" in rule.describe()


def test_diagnose_names_it_in_a_trainer_state(tmp_path: Path) -> None:
    from rlmon.service.diagnose.findings import diagnose
    from rlmon.service.diagnose.formats import read_paths
    from tests.unit.diagnose.test_diagnose_trainer_state import write_state

    trl = {c.REWARD: "reward", c.RESPONSE_LENGTH: "completions/mean_length", c.KL: "kl",
           c.ENTROPY: "entropy"}
    rows = {step + 1: {trl[k]: v for k, v in m.items()}
            for step, m in enumerate(run(2, "linear", hack_at=100))}
    (logged,), problems = read_paths([write_state(tmp_path / "trainer_state.json", rows)])
    assert problems == []
    (finding,) = [f for f in diagnose(logged).findings
                  if f.alert == "RewardHacking" and f.state == "firing"]
    assert 101 <= finding.step <= 113
    assert finding.what_to_check == reward_hacking.WHAT_TO_CHECK
    assert {r.key for r in finding.related} >= {"reward", "completions/mean_length", "kl"}


def test_without_the_kl_only_the_verifier_gap_is_judged() -> None:
    def no_kl(rows: list[dict[str, float]]) -> list[dict[str, float]]:
        return [{k: v for k, v in row.items() if k != c.KL} for row in rows]

    assert fired(no_kl(run(1, "linear", hack_at=100))) == []
    found = fired(no_kl(run(3, "concave", hack_at=100, kind="gap", verifier=True)))
    assert found and "reward - verifier gap" in found[0][1]


@pytest.mark.parametrize("seed", range(5))
def test_the_gap_s_mean_departure_matches_a_numpy_reference(seed: int) -> None:
    """The newest three steps' mean departure from the baseline's robust line, each clipped,
    over the robust spread (1.4826 x MAD) of the baseline residuals' own three-step means."""
    rng = np.random.default_rng(seed)
    base = 0.1 + 0.002 * np.arange(40) + 0.03 * rng.standard_normal(40)
    recent = 0.1 + 0.002 * np.arange(48, 51) + np.array([0.05, 0.2, 0.04])
    ahead, clip, floor = 11, 0.09, 1e-3
    half = 20
    slope = (np.median(base[half:]) - np.median(base[:half])) / half
    detrended = base - slope * (np.arange(40) - 19.5)
    residuals = detrended - np.median(detrended)
    means = np.convolve(residuals, np.ones(3) / 3, mode="valid")
    spread = 1.4826 * np.median(np.abs(means - np.median(means)))
    line = np.median(detrended) + slope * (np.arange(39 + ahead - 2, 39 + ahead + 1) - 19.5)
    expected = np.mean(np.clip(recent - line, -clip, clip)) / max(spread, floor)
    _, fitted_slope, _, fitted_level = reward_hacking.robust_line(base.tolist(), ahead)
    got = reward_hacking.mean_departure_z(base.tolist(), fitted_slope, fitted_level,
                                          recent.tolist(), ahead, floor, clip)
    assert got == pytest.approx(expected, rel=1e-9)
    # a white gap averages down: the spread of its three-step means is near its SD / sqrt(3)
    assert 0.5 * 0.03 / math.sqrt(3) < spread < 2 * 0.03 / math.sqrt(3)
