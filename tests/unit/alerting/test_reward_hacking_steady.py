"""RewardHacking on a hack that climbs at a steady rate and never stops (issue 39): the
reward-length-KL signature without a verifier, the verifier gap alone and both are named within
15 steps of the onset and held while the climb goes on (no "resolved" a few steps later), in a
``trainer_state.json`` and in its TensorBoard copy alike (``train/rollout/verifier_score``)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from bench import bench_reward_hacking as bench
from rlmon.service.alerting.engine import AlertEngine
from rlmon.service.alerting.rules import reward_hacking_rule
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.metrics import catalog as c

STEPS, ONSET = bench.ISSUE_STEPS, bench.ISSUE_ONSET
TRL_KEYS = {c.REWARD: "reward", c.RESPONSE_LENGTH: "completions/mean_length", c.KL: "kl",
            c.ENTROPY: "entropy", c.VERIFIER_SCORE: c.VERIFIER_SCORE}
climb = bench.issue_run  # the issue's run, as the reward-hacking benchmark scores it


def transitions(rows: list[dict[str, float]]) -> list[tuple[int, str]]:
    engine = AlertEngine([reward_hacking_rule()])
    out = []
    for step, metrics in enumerate(rows):
        out += [(e.step, e.state) for e in engine.evaluate(
            StepRecord("r", "trainer", step, True, 1, 1, (), metrics))]
    return out


@pytest.mark.parametrize(("signature", "verifier"), [(True, False), (True, True), (False, True)],
                         ids=["signature-without-verifier", "both", "verifier-gap-alone"])
def test_a_steady_hack_is_named_within_15_steps_and_held_to_the_end(
        signature: bool, verifier: bool) -> None:
    for seed in range(4):
        events = transitions(climb(seed, signature, verifier))
        assert events, (seed, "never named")
        (step, state), *rest = events
        assert state == "firing" and ONSET <= step <= ONSET + 15, (seed, events)
        assert rest == [], (seed, "resolved while the hack goes on", rest)


def test_reward_and_length_growing_together_stay_quiet_with_the_pinned_baseline() -> None:
    """A healthy run whose reward, length and KL grow together from the start, at the issue's
    rates: the pinned baseline does not turn the run's own trend into an alarm."""
    for seed in range(4):
        rng = np.random.default_rng(seed)
        rows = [{c.REWARD: 0.2 + 0.004 * s + 0.02 * rng.standard_normal(),
                 c.RESPONSE_LENGTH: 200 * 1.006 ** s * math.exp(0.02 * rng.standard_normal()),
                 c.KL: (0.01 + 0.002 * s) * math.exp(0.05 * rng.standard_normal())}
                for s in range(STEPS)]
        assert transitions(rows) == [], seed


def _write_both(tmp_path: Path, rows: list[dict[str, float]]) -> list[Path]:
    from tests.unit.diagnose.test_diagnose_tensorboard import write_tensorboard
    from tests.unit.diagnose.test_diagnose_trainer_state import write_state

    logged = {step + 1: {TRL_KEYS[k]: v for k, v in m.items()} for step, m in enumerate(rows)}
    return [write_state(tmp_path / "state" / "trainer_state.json", logged),
            write_tensorboard(tmp_path / "tb", logged)]


@pytest.mark.parametrize("signature", [True, False], ids=["both", "verifier-gap-alone"])
def test_every_format_names_it_at_the_same_step(tmp_path: Path, signature: bool) -> None:
    from rlmon.service.diagnose.findings import diagnose
    from rlmon.service.diagnose.formats import read_paths

    found = []
    for path in _write_both(tmp_path, climb(1, signature, verifier=True)):
        (run,), problems = read_paths([path])
        assert problems == []
        d = diagnose(run)
        info = {k.key.removeprefix("train/"): k for k in d.keymap.keys}[c.VERIFIER_SCORE]
        assert info.status.value == "canonical" and info.name == c.VERIFIER_SCORE, info
        hacking = [(f.step, f.state) for f in d.findings if f.alert == "RewardHacking"]
        assert len(hacking) == 1 and hacking[0][1] == "firing", (run.format, hacking)
        found.append(hacking[0][0])
    assert found[0] == found[1] and ONSET < found[0] <= ONSET + 16


def test_the_verifier_gap_credits_the_reward_its_lead_as_the_signature_does() -> None:
    """A reward a little above its trend while the verifier stays put: the gap leg's evidence is
    the reward's departure credited its lead (it moves least against its noise in a steady
    hack, issue 39), not the bare departure."""
    from collections import deque

    from rlmon.service.alerting import reward_hacking

    params = reward_hacking_rule().reward_hacking
    rng = np.random.default_rng(3)
    history: deque[float] = deque()
    score = 0.0
    for _ in range(params.keep):  # a noisy reward the verifier follows closely
        reward = 0.5 + 0.05 * rng.standard_normal()
        score, _ = reward_hacking.observe(params, history, score, {
            c.REWARD: reward, c.RESPONSE_LENGTH: 300.0, c.KL: 0.05,
            c.VERIFIER_SCORE: reward + 0.005 * rng.standard_normal()})
    _, found = reward_hacking.observe(params, history, score, {
        c.REWARD: 0.6, c.RESPONSE_LENGTH: 300.0, c.KL: 0.05, c.VERIFIER_SCORE: 0.5})
    assert found is not None and found.z_gap > found.z_reward + params.reward_lead
    assert found.evidence == pytest.approx(found.z_reward + params.reward_lead)


def test_a_hack_whose_kl_moves_little_against_its_level_is_named_within_15_steps() -> None:
    """The KL already at 0.15 when the hack adds +0.003 a step: its leg is only 2-3 robust SDs
    out after 15 steps while the reward and the length are far out. All three legs are out, and
    the middle one is the evidence: the weakest alone named it 14-16 steps after the onset or
    never (seeds 2 and 3)."""
    for seed in range(6):
        rng = np.random.default_rng(seed)
        rows = []
        for step in range(STEPS):
            k = max(0, step - ONSET + 1)
            rows.append({
                c.REWARD: 0.3 + 0.001 * step + 0.008 * k + 0.02 * rng.standard_normal(),
                c.RESPONSE_LENGTH: 300 * 1.012 ** k * math.exp(0.02 * rng.standard_normal()),
                c.KL: (0.15 + 0.003 * k) * math.exp(0.05 * rng.standard_normal())})
        events = transitions(rows)
        assert events and events[0][1] == "firing", (seed, events)
        assert ONSET <= events[0][0] <= ONSET + 15 and events[1:] == [], (seed, events)


def test_a_healthy_take_off_that_the_verifier_follows_is_not_called_reward_hacking() -> None:
    """A fast take-off (reward 0.2 to 0.6 over ~40 steps, the length following it at 1.5
    log-units per unit of reward from a plateau where that coupling cannot be measured, the KL
    rising with the progress) moves the three legs as a hack does. Without a held-out score the
    curves cannot tell it from one, and it fires; a verifier score that keeps up with the reward
    says the gain is real, and it stays quiet."""
    for seed in range(6):
        rng = np.random.default_rng(seed)
        rows = []
        for step in range(200):
            progress = 1 / (1 + math.exp(-(step - 110) / 8))
            clean = 0.2 + 0.4 * progress
            rows.append({
                c.REWARD: clean + 0.02 * rng.standard_normal(),
                c.RESPONSE_LENGTH: 300 * math.exp(1.5 * (clean - 0.2)
                                                  + 0.02 * rng.standard_normal()),
                c.KL: (0.01 + 0.05 * progress) * math.exp(0.05 * rng.standard_normal()),
                c.VERIFIER_SCORE: 0.9 * clean + 0.02 * rng.standard_normal()})
        assert transitions(rows) == [], seed
        without = [{k: v for k, v in row.items() if k != c.VERIFIER_SCORE} for row in rows]
        assert [state for _, state in transitions(without)][:1] == ["firing"], seed


def _hack(seed: int, coupling: float = 0.0, kl_for: int = STEPS) -> list[dict[str, float]]:
    """A learner whose reward rises +0.002 a step with its length following at ``coupling``
    log-units per unit of reward; from step 70 the issue's hack (+0.008 reward, +1.2 % length,
    +0.004 KL a step), the KL's part of it for ``kl_for`` steps, then pulled back to the KL's
    course over 10 steps."""
    rng = np.random.default_rng(seed)
    rows = []
    for step in range(STEPS):
        k = max(0, step - ONSET + 1)
        clean = 0.2 + 0.002 * step
        rows.append({
            c.REWARD: clean + 0.008 * k + 0.02 * rng.standard_normal(),
            c.RESPONSE_LENGTH: 300 * math.exp(coupling * (clean - 0.2))
            * 1.012 ** k * math.exp(0.02 * rng.standard_normal()),
            c.KL: (0.02 + 0.0002 * step
                   + 0.004 * (k if k <= kl_for else max(0.0, kl_for - 2.0 * (k - kl_for))))
            * math.exp(0.05 * rng.standard_normal())})
    return rows


def test_a_hack_in_a_run_whose_length_always_followed_its_reward_is_named() -> None:
    """The length had followed the reward at 2 log-units per unit of reward. Judged against
    what the reward's departure "explains" at that coupling, the hack's longer completions
    were no departure at all, and the hack was named late or never; judged against the
    length's own course they are."""
    for seed in range(6):
        events = transitions(_hack(seed, coupling=2.0))
        assert events and events[0][1] == "firing", (seed, events)
        assert ONSET <= events[0][0] <= ONSET + 15 and events[1:] == [], (seed, events)


def test_the_alert_holds_while_reward_and_length_go_on_after_the_kl_is_reined_in() -> None:
    """An adaptive KL controller pulls the KL back to its course from 20 steps after the onset while
    the reward and the length keep climbing: named with all three legs out, and held while two
    of them stay out (it "resolved" a few steps after the KL came back)."""
    for seed in range(6):
        events = transitions(_hack(seed, kl_for=20))
        assert events and events[0][1] == "firing", (seed, events)
        assert ONSET <= events[0][0] <= ONSET + 15 and events[1:] == [], (seed, events)


def test_a_burst_of_lucky_batches_is_not_a_hack() -> None:
    """Three steps whose reward is 7-10 robust SDs above its course while the verifier does not
    follow (heavy-tailed sampling luck) and a fourth a third as lucky, then back: a step's
    evidence is clipped so that no fewer than four steps far out fire (three at the cap and a
    fourth fired before)."""
    for seed in range(6):
        rng = np.random.default_rng(seed)
        rows = []
        for step in range(STEPS):
            skill = 0.3 + 0.001 * step
            luck = (0.2, 0.2, 0.25, 0.07)[step - 100] if 100 <= step < 104 else 0.0
            rows.append({c.REWARD: skill + luck + 0.02 * rng.standard_normal(),
                         c.RESPONSE_LENGTH: 300 * math.exp(0.02 * rng.standard_normal()),
                         c.KL: 0.05 * math.exp(0.05 * rng.standard_normal()),
                         c.VERIFIER_SCORE: skill + 0.02 * rng.standard_normal()})
        assert transitions(rows) == [], seed


def test_a_climb_away_from_the_verifier_holds_while_the_skill_both_share_dips() -> None:
    """The reward climbs +0.01 a step away from the verifier from step 70; from step 95 the
    policy's skill, which both scores see, falls by 0.4 over 10 steps, so the reward is back
    near its old course while the gap stays open. Once named, the open gap holds the alert (it
    "resolved" when the reward's own departure fell)."""
    for seed in range(6):
        rng = np.random.default_rng(seed)
        rows = []
        for step in range(STEPS):
            k = max(0, step - ONSET + 1)
            skill = 0.5 + 0.001 * step - 0.04 * min(10, max(0, step - 95))
            rows.append({c.REWARD: skill + 0.01 * k + 0.02 * rng.standard_normal(),
                         c.RESPONSE_LENGTH: 300 * math.exp(0.02 * rng.standard_normal()),
                         c.KL: 0.05 * math.exp(0.05 * rng.standard_normal()),
                         c.VERIFIER_SCORE: skill + 0.02 * rng.standard_normal()})
        events = transitions(rows)
        assert events and events[0][1] == "firing", (seed, events)
        assert ONSET <= events[0][0] <= ONSET + 15 and events[1:] == [], (seed, events)
