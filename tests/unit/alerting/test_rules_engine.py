"""Alert rules: the default pack is docs/design.md's table; YAML errors name rule and field; the
state machine fires after N steps and resolves after N false steps."""

from __future__ import annotations

import math

import pytest

from rlmon.service.alerting.engine import AlertEngine
from rlmon.service.alerting.rules import RuleError, default_rules, fixed_rules, parse_rules
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.metrics import catalog

# docs/design.md, "Default alert rules" (normative): name -> (severity, metric, for)
DESIGN_TABLE = {
    "ISRatioDivergence": ("critical", "actor/is_ratio", 1),
    "ISRatioStale": ("warning", "actor/is_ratio_min", 3),
    "LogprobMismatch": ("warning", "actor/logp_diff", 2),  # issue 39: one batch's spike
    "LogprobDivergence": ("critical", "actor/logp_diff", 1),
    "ClipRatioHigh": ("warning", "actor/clip_ratio", 3),
    "EntropyCollapse": ("critical", "actor/entropy", 3),
    "KLDivergence": ("warning", "actor/kl", 3),
    "GradNormHigh": ("warning", "actor/grad_norm", 3),
    "NonFiniteMetric": ("critical", "*", 1),
    "NoLearningSignal": ("critical", "rollout/frac_reward_zero_std", 3),
    "RewardStuck": ("warning", "rollout/reward", 20),
    "CompletionsTruncated": ("warning", "rollout/clipped_ratio", 3),
    "RankMissing": ("critical", "*", 1),
    "ReplicaMismatch": ("critical", "*", 1),
    "MetricOutOfDomain": ("critical", "*", 1),
    "StragglerRank": ("warning", "perf/straggler_ratio", 5),  # issue 15, beyond the design's table
    # issue 23: judged by time on the liveness timer, not by steps (docs/liveness.md)
    "RunStalled": ("critical", "*", 1),
    "StageStuck": ("warning", "*", 1),
    "RunDied": ("critical", "*", 1),
    "StepTimeRegression": ("warning", "*", 1),
    # issue 29: how a process ended, and a silent run whose processes still exist
    "RunFailed": ("critical", "*", 1),
    "RunPreempted": ("warning", "*", 1),
    "RunFrozen": ("warning", "*", 1),
}


def step(n: int, complete: bool = True, **metrics: float) -> StepRecord:
    return StepRecord("r", "actor", n, complete, 1, 1 if complete else 0, (), metrics)


def test_default_pack_is_exactly_the_design_table() -> None:
    """The fixed-threshold pack; the early-warning rules that follow it are pinned in
    test_early_warning.py."""
    rules = {r.name: r for r in fixed_rules()}
    assert set(rules) == set(DESIGN_TABLE)
    for name, (severity, metric, for_steps) in DESIGN_TABLE.items():
        rule = rules[name]
        assert (rule.severity.value, rule.metric, rule.for_steps) == (severity, metric, for_steps)
        # hysteresis (issue 30): a level rule keeps firing for the catalog's measured
        # RESOLVE_AFTER good steps; the structural rules (NaN, a missing rank, replicas that
        # disagree, a value out of its domain) judge events, and the time-based ones resolve on
        # the liveness timer's word: both resolve at their first good step
        structural = {"NonFiniteMetric", "RankMissing", "ReplicaMismatch", "MetricOutOfDomain"}
        timed = rule.condition.value in {s.condition for s in catalog.LIVENESS_ALERTS}
        assert rule.resolve_steps == (for_steps if timed or name in structural
                                      else catalog.RESOLVE_AFTER), name


@pytest.mark.parametrize(
    ("name", "metric", "fire", "quiet"),
    [
        ("ISRatioDivergence", "actor/is_ratio", [0.49, 2.01], [0.5, 2.0, 1.0]),
        ("ISRatioStale", "actor/is_ratio_min", [0.09], [0.1, 0.5]),
        ("LogprobMismatch", "actor/logp_diff", [0.11], [0.1]),
        ("LogprobDivergence", "actor/logp_diff", [1.01], [1.0]),
        ("ClipRatioHigh", "actor/clip_ratio", [0.31], [0.3]),
        ("EntropyCollapse", "actor/entropy", [0.009], [0.01]),
        ("KLDivergence", "actor/kl", [2.01], [2.0]),
        ("GradNormHigh", "actor/grad_norm", [10.01], [10.0]),
        ("NoLearningSignal", "rollout/frac_reward_zero_std", [0.99, 1.0], [0.98]),
        ("RewardStuck", "rollout/reward", [0.0, 1e-10], [1e-9, 0.5]),
        ("CompletionsTruncated", "rollout/clipped_ratio", [0.81], [0.8]),
    ],
)
def test_thresholds_of_default_rules(name: str, metric: str, fire: list[float], quiet: list[float]) -> None:
    rule = next(r for r in default_rules() if r.name == name)
    for value in fire + quiet:
        engine = AlertEngine([rule])
        events = [e for n in range(rule.for_steps) for e in engine.evaluate(step(n, **{metric: value}))]
        assert bool(events) == (value in fire), (name, value)


def test_for_n_and_resolve_after_n() -> None:
    rule = next(r for r in default_rules() if r.name == "ClipRatioHigh")
    engine = AlertEngine([rule])
    good = catalog.RESOLVE_AFTER
    values = [0.4, 0.4, 0.4, 0.4] + [0.1] * (good - 1) + [0.4] + [0.1] * good
    events = [(e.step, e.state) for n, v in enumerate(values)
              for e in engine.evaluate(step(n, **{"actor/clip_ratio": v}))]
    # fires at the 3rd bad step; a bad step before the RESOLVE_AFTER-th good one keeps it
    assert events == [(2, "firing"), (len(values) - 1, "resolved")]


def test_absent_metric_does_not_break_the_streak() -> None:
    rule = next(r for r in default_rules() if r.name == "EntropyCollapse")
    engine = AlertEngine([rule])
    seq = [step(0, **{"actor/entropy": 0.0}), step(1), step(2, **{"actor/entropy": 0.0}),
           step(3, **{"actor/entropy": 0.0})]
    fired = [e.step for s in seq for e in engine.evaluate(s)]
    assert fired == [3]


def test_out_of_order_steps_are_skipped_not_evaluated() -> None:
    engine = AlertEngine(default_rules())
    engine.evaluate(step(5, **{"actor/is_ratio": 1.0}))
    assert engine.evaluate(step(4, **{"actor/is_ratio": 9.0})) == []
    assert engine.skipped_out_of_order == 1


def test_stuck_and_trend_conditions() -> None:
    rules = parse_rules("""
include_defaults: false
rules:
  - {name: LossStuck, severity: warning, condition: stuck, metric: actor/loss, window: 3}
  - {name: KLClimbing, severity: warning, condition: trend, metric: actor/kl, window: 4, direction: up}
""")
    engine = AlertEngine(rules)
    fired = []
    for n, (loss, kl) in enumerate([(0.69, 0.1), (0.69, 0.2), (0.69, 0.3), (0.5, 0.4), (0.4, 0.3)]):
        record = step(n, **{"actor/loss": loss, "actor/kl": kl})
        fired += [(e.step, e.alert, e.state) for e in engine.evaluate(record)]
    assert sorted(fired) == [(2, "LossStuck", "firing"), (3, "KLClimbing", "firing"),
                             (3, "LossStuck", "resolved"), (4, "KLClimbing", "resolved")]


def test_non_finite_and_rank_missing() -> None:
    engine = AlertEngine(default_rules())
    events = engine.evaluate(step(0, complete=False, **{"actor/loss": math.inf}))
    assert {(e.alert, e.metric) for e in events} == {("NonFiniteMetric", "actor/loss"),
                                                     ("RankMissing", "ranks_reporting")}
    resolved = engine.evaluate(step(1, **{"actor/loss": 1.0}))
    assert {(e.alert, e.state) for e in resolved} == {("NonFiniteMetric", "resolved"),
                                                      ("RankMissing", "resolved")}


def test_user_file_overrides_thresholds_disables_and_adds() -> None:
    rules = parse_rules("""
disable: [RewardStuck]
rules:
  - {name: ISRatioDivergence, severity: critical, condition: outside, metric: actor/is_ratio,
     low: 0.8, high: 1.25}
  - {name: ResponseTooLong, severity: warning, condition: threshold,
     metric: rollout/response_length, op: ">", threshold: 4000, for: 2}
""")
    names = [r.name for r in rules]
    assert "RewardStuck" not in names
    assert names.count("ISRatioDivergence") == 1
    assert "ResponseTooLong" in names
    engine = AlertEngine(rules)
    assert [e.alert for e in engine.evaluate(step(0, **{"actor/is_ratio": 1.3}))] == ["ISRatioDivergence"]


def test_a_rule_named_like_a_default_without_a_condition_retunes_it() -> None:
    """docs/early-warning.md's `decision: 8`: the fields given replace the default's, the rest stay."""
    defaults = {r.name: r for r in default_rules()}
    rules = {r.name: r for r in parse_rules("""
rules:
  - {name: EntropySliding, decision: 8}
  - {name: KLDivergence, threshold: 1.0, for: 2}
""")}
    assert set(rules) == set(defaults)
    assert rules["EntropySliding"] == defaults["EntropySliding"].model_copy(
        update={"decision": 8.0})
    assert rules["KLDivergence"] == defaults["KLDivergence"].model_copy(
        update={"threshold": 1.0, "for_steps": 2})
    with pytest.raises(RuleError, match=r"rules\[0\] \(EntropySliding\): decison"):
        parse_rules("rules: [{name: EntropySliding, decison: 8}]")  # a typo is still named
    with pytest.raises(RuleError, match=r"'op' does not apply to condition 'baseline'"):
        parse_rules("rules: [{name: EntropySliding, op: '<'}]")  # retuned, still checked
    with pytest.raises(RuleError, match="severity: Field required"):
        parse_rules("rules: [{name: EntropySliding, decision: 8}]\ninclude_defaults: false")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("rules: [{name: X, severity: critical, condition: threshold, metric: m}]",
         "rules[0] (X): Value error, condition 'threshold' needs 'op' and 'threshold'"),
        ("rules: [{name: X, severity: loud, condition: non_finite}]", "rules[0] (X): severity"),
        ("rules: [{name: X, severity: warning, condition: outside, metric: m, low: 3, high: 1}]",
         "'low' (3.0) is above 'high' (1.0)"),
        ("rules: [{name: X, severity: warning, condition: stuck, metric: m}]", "needs 'window'"),
        ("rules: [{name: X, severity: warning, condition: non_finite, for: 0}]", "rules[0] (X): for"),
        ("rules: [{name: X, severity: warning, condition: non_finite, colour: red}]", "colour"),
        ("disable: [Nope]", "disable: no rule named 'Nope'"),
        ("rules: [{name: X, severity: warning, condition: non_finite}, "
         "{name: X, severity: warning, condition: non_finite}]", "defined more than once"),
        ("rules: {a: 1}", "rules"),
        (": : :", "not valid YAML"),
    ],
)
def test_invalid_rule_files_name_rule_and_field(text: str, message: str) -> None:
    with pytest.raises(RuleError) as err:
        parse_rules(text, source="my-rules.yaml")
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("rules: [{name: X, severity: warning, condition: threshold, metric: m, op: '>', "
         "threshold: .nan}]", "'threshold' must be a finite number"),
        ("rules: [{name: X, severity: warning, condition: rank_missing, threshold: 3}]",
         "'threshold' does not apply to condition 'rank_missing'"),
        ("rules: [{name: X, severity: warning, condition: outside, metric: m, low: 0, high: 1, "
         "window: 4}]", "'window' does not apply to condition 'outside'"),
    ],
)
def test_rule_fields_must_fit_the_condition(text: str, message: str) -> None:
    with pytest.raises(RuleError) as err:
        parse_rules(text)
    assert message in str(err.value)


def test_resolved_non_finite_names_the_metric_that_fired() -> None:
    engine = AlertEngine([r for r in default_rules() if r.name == "NonFiniteMetric"])
    (fired,) = engine.evaluate(step(0, **{"actor/kl": math.nan}))
    (resolved,) = engine.evaluate(step(1, **{"actor/kl": 0.1}))
    assert (fired.metric, resolved.metric, resolved.state) == ("actor/kl", "actor/kl", "resolved")
    assert resolved.value == 0.1
