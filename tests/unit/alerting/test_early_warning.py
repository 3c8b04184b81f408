"""Early-warning rules (issue 16): the baseline condition's warm-up, resolve, persistence across a
service restart and replay equality; the default rules and their catalog parameters; the
``rlmon replay --rules`` backtest."""

from __future__ import annotations

import json
import math
import sqlite3
from collections import deque
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlmon.service.alerting.backtest import Episode, backtest
from rlmon.service.alerting.baseline import BaselineParams, observe, predict
from rlmon.service.alerting.engine import AlertEngine, AlertEvent
from rlmon.service.alerting.rules import (
    Condition,
    Rule,
    RuleError,
    default_rules,
    early_warning_rules,
    fixed_rules,
    parse_rules,
)
from rlmon.service.config import Settings
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.metrics import catalog
from rlmon.service.replay import replay
from rlmon.service.service_core import ServiceCore
from rlmon.service.storage.history import HistoryStore
from tests.support.cli import run_rlmon
from tests.support.paths import REPO
from tests.support.records import step_record

ROOT = REPO
ENTROPY = catalog.get("actor/entropy").name
KL = catalog.get("actor/kl").name

# The list: the slow failures each early-warning rule watches, and in which direction.
REQUIRED = {
    ("actor/entropy", "down"), ("actor/kl", "up"), ("actor/logp_diff", "up"),
    ("actor/grad_norm", "up"), ("actor/clip_ratio", "up"), ("rollout/response_length", "up"),
    ("rollout/reward", "down"), ("rollout/policy_lag", "up"),
    # reward collapse's second witness: prompt groups whose completions all score alike
    ("rollout/frac_reward_zero_std", "up"),
}


def entropy_rule(**fields: object) -> Rule:
    return Rule.model_validate({"name": "Slide", "severity": "warning", "condition": "baseline",
                                "metric": ENTROPY, "direction": "down", "warmup": 10,
                                "window": 20, "resolve_after": 2, **fields})


def healthy(n: int, seed: int = 0, level: float = 0.4) -> list[float]:
    rng = np.random.default_rng(seed)
    return [float(v) for v in level * (1 + 0.03 * rng.standard_normal(n))]


def records(values: Iterable[float], run: str = "r", start: int = 0,
            metric: str = ENTROPY) -> list[StepRecord]:
    return [step_record(run=run, step=start + i, metrics={metric: v})
            for i, v in enumerate(values)]


def run_engine(rules: list[Rule], recs: Iterable[StepRecord]) -> list[AlertEvent]:
    engine = AlertEngine(rules)
    return [e for rec in recs for e in engine.evaluate(rec)]


def transitions(events: Iterable[AlertEvent]) -> list[tuple[str, str, int]]:
    return [(e.alert, e.state, e.step) for e in events]


# --- the default rules ---------------------------------------------------------------------------

def test_default_pack_holds_every_early_warning_rule_with_catalog_parameters() -> None:
    rules = {r.name: r for r in default_rules()}
    # the catalog's baseline rules, then RewardHacking (its own detector: test_reward_hacking.py)
    assert [r.name for r in early_warning_rules()] == [
        *(s.name for s in catalog.EARLY_WARNINGS), "RewardHacking"]
    for spec in catalog.EARLY_WARNINGS:
        rule = rules[spec.name]
        assert (rule.severity.value, rule.condition, rule.metric) == (
            "warning", Condition.BASELINE, spec.metric)
        assert rule.baseline == spec.params  # every number comes from the catalog
        assert (rule.for_steps, rule.resolve_steps) == (spec.for_steps, spec.resolve_after)
        assert catalog.lookup(spec.metric) is not None
    assert {(s.metric, s.params.direction) for s in catalog.EARLY_WARNINGS} == REQUIRED
    assert not {r.name for r in fixed_rules()} & {r.name for r in early_warning_rules()}


def test_rule_file_can_turn_early_warning_off_or_retune_one_rule() -> None:
    off = parse_rules("early_warning: false\n")
    assert [r.name for r in off] == [r.name for r in fixed_rules()]
    tuned = parse_rules("rules:\n  - {name: EntropySliding, severity: warning, condition: "
                        "baseline, metric: actor/entropy, direction: down, decision: 12}\n")
    rule = next(r for r in tuned if r.name == "EntropySliding")
    assert rule.baseline.decision == 12 and rule.baseline.window == BaselineParams("down").window


@pytest.mark.parametrize(("fields", "message"), [
    ({"direction": None}, "needs 'direction'"),
    ({"warmup": 30, "window": 20}, "'window' (20) must be at least 'warmup' (30)"),
    ({"log_offset": 0.01, "floor": 0.1}, "'floor' is in the metric's units"),
    ({"decision": 0}, "greater than 0"),
    ({"warmup": 3}, "greater than or equal to 8"),
    ({"allowance": math.inf}, "'allowance' must be a finite number"),
])
def test_invalid_baseline_rules_name_the_field(fields: dict[str, object], message: str) -> None:
    body = {"name": "Slide", "severity": "warning", "condition": "baseline", "metric": ENTROPY,
            "direction": "down", **fields}
    with pytest.raises(RuleError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_rules(json.dumps({"rules": [body]}))


def test_baseline_fields_on_another_condition_are_refused() -> None:
    with pytest.raises(RuleError, match="'decision' does not apply to condition 'threshold'"):
        parse_rules("rules:\n  - {name: X, severity: warning, condition: threshold, "
                    "metric: actor/kl, op: '>', threshold: 1, decision: 3}\n")


# --- the detector --------------------------------------------------------------------------------

def test_baseline_follows_a_healthy_trend_and_ignores_one_outlier() -> None:
    params = BaselineParams("down", window=30, warmup=10)
    trend = [0.5 - 0.002 * i for i in range(30)]
    expected, _ = predict(params, deque(trend))
    assert expected == pytest.approx(0.5 - 0.002 * 30, abs=1e-9)  # extrapolated, not the median
    spiked = list(trend)
    spiked[-1] = 50.0
    assert predict(params, deque(spiked))[0] == pytest.approx(expected, abs=0.005)  # not 50


def test_a_level_baseline_does_not_learn_a_slow_climb_as_its_slope() -> None:
    # a steady climb from the first step: the drift-following baseline takes it for healthy
    # drift, the level baseline (follow_drift=False, for metrics with no healthy drift) does not
    rng = np.random.default_rng(3)
    values = [2 + 0.03 * i + 0.1 * float(rng.standard_normal()) for i in range(150)]
    fired = {}
    for follow in (True, False):
        rule = Rule.model_validate({
            "name": "Climb", "severity": "warning", "condition": "baseline", "metric": KL,
            "direction": "up", "window": 60, "warmup": 20, "allowance": 1, "decision": 4,
            "follow_drift": follow})
        events = run_engine([rule], records(values, metric=KL))
        fired[follow] = [e.step for e in events if e.state == "firing"]
    assert fired[True] == []
    assert fired[False] and fired[False][0] < 30  # within ten steps of the warm-up's end
    assert "baseline level" in Rule.model_validate({
        "name": "L", "severity": "warning", "condition": "baseline", "metric": KL,
        "direction": "up", "follow_drift": False}).describe()


def test_a_metric_that_moves_in_steps_is_judged_in_its_own_steps() -> None:
    # a fraction of 8 prompt groups, mostly 0: its MAD is 0, and without the resolution floor a
    # single group more (0.125) would be a 12-SD jump; two groups more twice in a row is not news
    params = BaselineParams("up", window=60, warmup=20, allowance=2, decision=10, floor=0.01,
                            relative_floor=0.0)
    window = [0.0] * 50 + [0.125] * 10
    assert predict(params, window)[1] == pytest.approx(0.125)
    history: deque[float] = deque(window)
    score = 0.0
    for value in (0.25, 0.25, 0.125, 0.25):
        score = observe(params, history, score, value)
    assert score < params.decision
    for _ in range(3):  # every group tied: the learning signal is gone
        score = observe(params, history, score, 1.0)
    assert score >= params.decision


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(min_value=0.0, max_value=1e6, allow_nan=False), max_size=9))
def test_nothing_accumulates_before_warmup(values: list[float]) -> None:
    params = BaselineParams("down", window=20, warmup=10)
    history: deque[float] = deque()
    score = 0.0
    for value in values:
        score = observe(params, history, score, value)
        assert score == 0.0
    assert list(history) == values


def test_no_alert_before_warmup_even_on_a_collapse() -> None:
    rule = entropy_rule()
    values = healthy(5) + [0.001] * 4  # collapses at step 5, inside the 10-step warm-up
    assert run_engine([rule], records(values)) == []


def test_a_collapse_that_settles_stays_firing_until_the_metric_returns() -> None:
    # issue 30: the new level is not learnt as the run's new normal while the alert fires; it
    # is judged against the level before the onset (before: resolved at the settled 0.2)
    rule = entropy_rule()
    values = (healthy(30) + [0.4 - 0.03 * i for i in range(1, 8)] + [0.2] * 80
              + healthy(20, seed=1))
    events = transitions(run_engine([rule], records(values)))
    assert events[0][:2] == ("Slide", "firing")
    assert 30 <= events[0][2] <= 33  # within three steps of the slide's start
    back = 30 + 7 + 80  # the first step at the old level again
    assert events[1:] == [("Slide", "resolved", back + 1)]  # resolve_after 2 good steps


def test_a_settled_slide_hands_over_to_its_level_rule_naming_it() -> None:
    rule = entropy_rule(level_rule="Floor")
    floor = Rule.model_validate({"name": "Floor", "severity": "critical",
                                 "condition": "threshold", "metric": ENTROPY, "op": "<",
                                 "threshold": 0.25, "for": 3})
    values = healthy(30) + [0.4 - 0.03 * i for i in range(1, 8)] + [0.2] * 30
    # (not the transitions: the slide's heading stated anew while it fires, issue 39)
    events = [e for e in run_engine([floor, rule], records(values)) if not e.repeat]
    assert [(e.alert, e.state) for e in events] == [
        ("Slide", "firing"), ("Floor", "firing"), ("Slide", "resolved")]
    assert events[1].step == events[2].step  # handed over at the step the level rule fired
    assert "handed over to Floor" in events[2].summary


def test_a_slide_that_goes_on_keeps_firing_until_it_settles() -> None:
    # 5% lower every step for 40 steps, then flat: extrapolating the window's line would take
    # the slide for the new normal within a window and resolve while the entropy still falls
    # (this rule resolved at step 42 that way, the slide going on to step 70)
    rule = entropy_rule(log_offset=1e-4, relative_floor=0.03, allowance=3, decision=3.5)
    slide = [0.4 * 0.95 ** i for i in range(1, 41)]
    values = healthy(30) + slide + [slide[-1]] * 60
    events = transitions(run_engine([rule], records(values)))
    assert events[0][:2] == ("Slide", "firing") and 30 <= events[0][2] <= 36
    assert len(events) == 1  # and stays firing once it settled (issue 30: not the new normal)


def test_single_spike_never_fires_and_the_other_direction_is_ignored() -> None:
    rule = entropy_rule()
    values = healthy(40)
    values[25] = 0.0  # one bad step
    assert run_engine([rule], records(values)) == []
    rising = healthy(25) + [0.4 * 1.05 ** i for i in range(1, 30)]
    assert run_engine([rule], records(rising)) == []


def test_resolve_after_counts_steps_back_under_the_decision() -> None:
    slide = healthy(30) + [0.1] * 3
    for resolve_after in (1, 4):
        rule = entropy_rule(resolve_after=resolve_after, allowance=0.5, decision=4)
        engine = AlertEngine([rule])
        fired = [e for rec in records(slide) for e in engine.evaluate(rec)]
        assert [e.state for e in fired] == ["firing"]
        state = engine.states[("r", "actor", "Slide")]
        # back to normal: the score drains by at least `allowance` a step
        back = records(healthy(60, seed=1), start=len(slide))
        resolved = [e for rec in back for e in engine.evaluate(rec)]
        assert [e.state for e in resolved] == ["resolved"]
        steps_under = resolved[0].step - len(slide) + 1
        assert steps_under >= resolve_after
        assert state.score < rule.baseline.decision


# --- persistence and replay ------------------------------------------------------------------------

def run_of(seed: int) -> list[StepRecord]:
    """A run whose entropy slides, KL climbs and recovers: several fire/resolve transitions."""
    rng = np.random.default_rng(seed)
    n = 120
    entropy = 0.45 * (1 + 0.03 * rng.standard_normal(n))
    entropy[60:80] *= np.linspace(1, 0.3, 20)
    entropy[80:] *= 0.3
    kl = 0.05 * np.exp(0.05 * rng.standard_normal(n))
    kl[40:55] *= np.exp(np.linspace(0, 2.5, 15))
    return [step_record(run="run", step=i, metrics={ENTROPY: float(entropy[i]), KL: float(kl[i])})
            for i in range(n)]


def quiet() -> Settings:
    return Settings.model_validate({"notifiers": {"console": {"enabled": False}}})


@pytest.mark.parametrize("cut", [25, 50, 70])
def test_state_survives_a_service_restart_bit_for_bit(tmp_path: Path, cut: int) -> None:
    recs = run_of(cut)
    reference = transitions(run_engine(default_rules(), recs))
    assert {a for a, _, _ in reference} >= {"EntropySliding", "KLClimbing"}
    core = ServiceCore(quiet(), state_dir=tmp_path)
    got = transitions(core.publish(recs[:cut]))
    live_states = {k: (list(s.history), s.score, s.firing) for k, s in core.spine.judge.engine.states.items()}
    core.close()
    again = ServiceCore(quiet(), state_dir=tmp_path)
    try:
        restored = {k: (list(s.history), s.score, s.firing)
                    for k, s in again.spine.judge.engine.states.items()}
        assert restored == live_states  # windows and CUSUM scores, exactly
        for rec in recs[cut:]:
            got += transitions(again.publish([rec]))
    finally:
        again.close()
    assert got == reference


def test_store_written_before_early_warning_gains_the_score_column(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE alert_state (run TEXT NOT NULL, role TEXT NOT NULL, alert TEXT NOT "
               "NULL, true_steps INTEGER NOT NULL, false_steps INTEGER NOT NULL, firing INTEGER "
               "NOT NULL, since_step INTEGER, history TEXT NOT NULL, metric TEXT NOT NULL DEFAULT "
               "'', PRIMARY KEY (run, role, alert))")
    db.execute("INSERT INTO alert_state VALUES ('r', 'actor', 'X', 1, 0, 0, NULL, '[0.5]', '')")
    db.commit()
    db.close()
    store = HistoryStore(path)
    try:
        state = store.alert_states()[("r", "actor", "X")]
        assert (list(state.history), state.score) == ([0.5], 0.0)
        state.score = 3.25
        store.add([], states={("r", "actor", "X"): state})
        assert store.alert_states()[("r", "actor", "X")].score == 3.25
    finally:
        store.close()


def contract_lines(recs: Iterable[StepRecord], order: list[int] | None = None) -> Iterator[str]:
    lines = [json.dumps({"run": r.run, "role": r.role, "step": r.step, "metrics": {
        name: {"sum": value, "count": 1} for name, value in r.metrics.items()}}) for r in recs]
    for i in order if order is not None else range(len(lines)):
        yield lines[i]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_replay_gives_the_live_engines_events(seed: int) -> None:
    recs = run_of(seed)
    live = run_engine(default_rules(), recs)
    assert any(e.alert in {"EntropySliding", "KLClimbing"} for e in live)
    shuffled = list(np.random.default_rng(seed).permutation(len(recs)))
    for order in (None, shuffled):  # alerts are evaluated in step order, whatever the arrival
        replayed = replay(contract_lines(recs, order)).alerts
        assert [e.to_json() for e in replayed] == [e.to_json() for e in live]


# --- the backtest ------------------------------------------------------------------------------------

def test_backtest_lists_episodes_per_rule_and_the_silent_rules() -> None:
    rules = [entropy_rule(), entropy_rule(name="Never", decision=1000)]
    values = healthy(30) + [0.1] * 10 + healthy(40, seed=2)
    result = replay(contract_lines(records(values)), rules)
    found = {(b.rule, b.run): b for b in backtest(rules, result.steps)}
    slide = found[("Slide", "r")]
    fired = [e for e in result.alerts if e.state == "firing"]
    resolved = [e for e in result.alerts if e.state == "resolved"]
    assert slide.episodes == (Episode(fired[0].step, resolved[0].step),)
    assert found[("Never", None)].episodes == ()


def test_replay_rules_cli_prints_when_each_rule_would_have_fired(tmp_path: Path) -> None:
    data = tmp_path / "run.jsonl"
    values = healthy(30) + [0.1] * 6
    data.write_text("\n".join(contract_lines(records(values))) + "\n")
    rules = tmp_path / "rules.yaml"
    rules.write_text("include_defaults: false\nrules:\n"
                     "  - {name: Slide, severity: warning, condition: baseline, metric: "
                     "actor/entropy, direction: down, warmup: 10, window: 20}\n"
                     "  - {name: Low, severity: critical, condition: threshold, metric: "
                     "actor/entropy, op: '<', threshold: 0.001}\n"
                     "  - {name: Typo, severity: warning, condition: threshold, metric: "
                     "actor/entropyy, op: '<', threshold: 0.001}\n")
    table = run_rlmon("replay", data, "--rules", rules)
    assert table.returncode == 0, table.stderr
    assert "rule backtest" in table.stdout
    fired_at = next(line for line in table.stdout.splitlines() if line.startswith("│ Slide"))
    assert "r/actor" in fired_at and "(firing)" in fired_at
    assert "never fired: Low" in table.stdout
    # a metric no step holds is most likely a typo: said, not only listed as never fired
    assert "metric 'actor/entropyy' is not in the catalog" in table.stderr
    as_json = run_rlmon("replay", data, "--rules", rules, "--json")
    assert as_json.returncode == 0, as_json.stderr
    stdout_types = {json.loads(line)["type"] for line in as_json.stdout.splitlines()}
    assert stdout_types == {"step", "alert"}  # stdout stays the replay contract
    tested = [json.loads(line) for line in as_json.stderr.splitlines()
              if '"backtest"' in line]
    by_rule = {t["rule"]: t for t in tested}
    alert = next(json.loads(line) for line in as_json.stdout.splitlines() if '"alert"' in line)
    assert by_rule["Slide"]["fired"] == [[alert["step"], None]]
    assert by_rule["Slide"]["run"] == "r" and by_rule["Low"]["fired"] == []
