"""One tester over the registry of condition kinds (rlmon.service.alerting.conditions): for every
condition, the live path (the engine judging each record in turn), the long-log path
(``evaluate_quietly``: each kind's batch half skips the steps where its check cannot hold) and
the engine's batch path (``evaluate_in_order``: baseline predictions prepared at once) raise
the same alerts at the same steps with the same values and leave the same states, on generated
logs that cross each condition both ways (holes, NaN and +-Inf, values hovering inside a resolve
margin, exact thresholds, flat and monotone stretches, slow drifts); and every rule has a
Prometheus expression or a stated reason, and a line in the docs table, from its definition."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlmon.service.alerting import baseline_batch
from rlmon.service.alerting.conditions.kind import PromQL, RlmonOnly
from rlmon.service.alerting.conditions.registry import CONDITIONS, LIVENESS_CONDITIONS, kind_of
from rlmon.service.alerting.engine import AlertEngine, AlertEvent, evaluate_in_order
from rlmon.service.alerting.quiet_steps import evaluate_quietly
from rlmon.service.alerting.rules import (
    Condition,
    Rule,
    default_rules,
    early_warning_rules,
    liveness_rules,
    reward_hacking_rule,
)
from rlmon.service.alerting.rules_doc import conditions_markdown
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.diagnose.columns import ColumnRows, RecordView, RowsBuilder
from rlmon.service.export.prometheus_rules import render
from rlmon.service.metrics import catalog as c

STEPS = 1_200


def _rule(**fields: object) -> Rule:
    return Rule.model_validate({"severity": "warning", **fields})


def _pack(name: str) -> Rule:
    return next(r for r in default_rules() if r.name == name)


# Rules exemplifying each condition: every op, margins, for/resolve_after, "*" and one metric.
EXAMPLES: dict[Condition, list[Rule]] = {
    Condition.THRESHOLD: [
        _rule(name="GtMargin", condition="threshold", metric=c.GRAD_NORM, op=">", threshold=10,
              resolve_margin=1.0, resolve_after=4, **{"for": 3}),
        _rule(name="Ge", condition="threshold", metric=c.GRAD_NORM, op=">=", threshold=10,
              critical=20),
        _rule(name="LtMargin", condition="threshold", metric=c.GRAD_NORM, op="<", threshold=2,
              resolve_margin=0.5, **{"for": 2}),
        _rule(name="Le", condition="threshold", metric=c.GRAD_NORM, op="<=", threshold=2,
              escalate_after=10),
        _rule(name="AbsLt", condition="threshold", metric=c.GRAD_NORM, op="abs<", threshold=0.5,
              resolve_margin=0.2, resolve_after=3),
    ],
    Condition.OUTSIDE: [
        _rule(name="Band", condition="outside", metric=c.IS_RATIO, low=0.5, high=2.0,
              resolve_margin=0.1, resolve_after=2),
        _rule(name="BandFor", condition="outside", metric=c.IS_RATIO, low=0.5, high=2.0,
              **{"for": 3}),
    ],
    Condition.NON_FINITE: [
        _rule(name="AnyNaN", condition="non_finite", severity="critical"),
        _rule(name="LossNaN", condition="non_finite", metric=c.LOSS, resolve_after=2),
    ],
    Condition.OUT_OF_DOMAIN: [
        _rule(name="AnyDomain", condition="out_of_domain", severity="critical"),
        _rule(name="ClipDomain", condition="out_of_domain", metric=c.CLIP_RATIO,
              **{"for": 2}),
    ],
    Condition.STUCK: [
        _rule(name="Flat", condition="stuck", metric=c.LOSS, window=4, tolerance=0.01),
        _rule(name="Exact", condition="stuck", metric=c.LOSS, window=3, resolve_after=2),
    ],
    Condition.TREND: [
        _rule(name="Up", condition="trend", metric=c.LOSS, window=4, direction="up"),
        _rule(name="Down", condition="trend", metric=c.LOSS, window=5, direction="down",
              **{"for": 2}),
    ],
    # down with a critical drop; up on a level only (no drift followed), for 2
    Condition.BASELINE: [_pack("EntropySliding"), _pack("GradNormBlowingUp"),
                         _rule(name="SlowToFire", condition="baseline", metric=c.ENTROPY,
                               direction="down", window=40, spike_steps=3, decision=6)],
    Condition.REWARD_HACKING: [reward_hacking_rule()],
    Condition.RANK_MISSING: [_pack("RankMissing")],
    Condition.REPLICA_MISMATCH: [_pack("ReplicaMismatch")],
    Condition.STRAGGLER_RANK: [_pack("StragglerRank")],
    **{rule.condition: [rule] for rule in liveness_rules()},
}

# kinds a log's records never meet (complete, one copy, no timelines, no clock): the batch half
# never judges them, which holds only while the records are so (checked below)
NOT_ON_LOGS = {Condition.RANK_MISSING, Condition.REPLICA_MISMATCH, Condition.STRAGGLER_RANK,
               *LIVENESS_CONDITIONS}

Palette = list[Callable[[np.random.Generator, int], np.ndarray]]


def _noise(level: float, sd: float) -> Callable[[np.random.Generator, int], np.ndarray]:
    return lambda rng, k: level + sd * rng.standard_normal(k)


def _exactly(*values: float) -> Callable[[np.random.Generator, int], np.ndarray]:
    return lambda rng, k: rng.choice(np.array(values), k)


_BAD = _exactly(np.nan, np.inf, -np.inf)
_RAMP_UP = lambda rng, k: 1.0 + np.cumsum(rng.uniform(0.01, 0.2, k))  # noqa: E731
_RAMP_DOWN = lambda rng, k: 5.0 - np.cumsum(rng.uniform(0.01, 0.2, k))  # noqa: E731

PALETTES: dict[str, Palette] = {
    # thresholds at 10 (margin 1), 2 (margin 0.5) and abs 0.5 (margin 0.2)
    c.GRAD_NORM: [_noise(5.0, 1.0), _noise(12.0, 1.0), _exactly(10.0, 9.5, 10.5, 8.9, 11.2),
                  _exactly(2.0, 1.8, 2.3, 2.6), _noise(0.0, 0.4), _exactly(-0.6, 0.5, -0.45),
                  _noise(25.0, 2.0), _BAD],
    c.IS_RATIO: [_noise(1.0, 0.1), _noise(0.4, 0.05), _exactly(0.5, 0.55, 0.62, 2.0, 1.95, 1.85),
                 _noise(2.1, 0.1), _BAD],
    c.ENTROPY: [_noise(0.5, 0.02), _exactly(-0.01, 0.0), _BAD],
    c.CLIP_RATIO: [_noise(0.05, 0.01), _exactly(1.0, 0.0, 1.2, -0.1), _BAD],
    c.LOSS: [_noise(1.0, 0.1), _exactly(0.7), lambda rng, k: 0.3 + rng.uniform(-0.004, 0.004, k),
             _RAMP_UP, _RAMP_DOWN, _BAD],
}
# the baseline rules' metrics: long healthy stretches, slow drifts, jumps, a collapse
BASELINE_METRICS = {c.ENTROPY: 0.5, c.GRAD_NORM: 1.0}


def _segments(rng: np.random.Generator, palette: Palette, lengths: tuple[int, ...]) -> np.ndarray:
    out = np.empty(STEPS)
    i = 0
    while i < STEPS:
        k = min(int(rng.choice(lengths)), STEPS - i)
        out[i:i + k] = palette[int(rng.integers(len(palette)))](rng, k)
        i += k
    return out


def _drifting(rng: np.random.Generator, level: float) -> np.ndarray:
    """Healthy stretches around ``level``, each followed by a fault: a slow drift away (up or
    down), a jump, or a few non-finite values; the next stretch is healthy again."""
    out = np.empty(STEPS)
    i, fault = 0, False
    while i < STEPS:
        k = min(int(rng.choice([5, 40, 120])) if fault else int(rng.integers(60, 250)),
                STEPS - i)
        values = level * (1.0 + 0.05 * rng.standard_normal(k))
        kind = int(rng.integers(3))
        if fault and kind == 0:
            values *= np.linspace(1.0, float(rng.choice([4.0, 0.2])), k)
        elif fault and kind == 1:
            values *= float(rng.choice([6.0, 0.05]))
        elif fault:
            values[:3] = rng.choice(np.array([np.nan, np.inf]), min(k, 3))
        out[i:i + k] = values
        i, fault = i + k, not fault
    return out


def _hacking(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Reward, length and KL: healthy stretches, each followed by a steady joint climb (a hack)
    that then falls back (the run settles)."""
    reward, length, kl = (np.empty(STEPS) for _ in range(3))
    i, climb = 0, 0.0
    while i < STEPS:
        k = min(int(rng.integers(60, 90)) if climb else int(rng.integers(90, 160)), STEPS - i)
        t = np.arange(k)
        reward[i:i + k] = 0.3 + 0.02 * rng.standard_normal(k) + climb * 0.008 * t
        length[i:i + k] = 200 * (1 + 0.02 * rng.standard_normal(k)) * (1 + climb * 0.012) ** t
        kl[i:i + k] = 0.05 * (1 + 0.05 * rng.standard_normal(k)) + climb * 0.004 * t
        i, climb = i + k, 1.0 - climb
    return {c.REWARD: reward, c.RESPONSE_LENGTH: length, c.KL: kl}


def _log(condition: Condition, seed: int) -> RecordView:
    rng = np.random.default_rng(seed)
    if condition is Condition.BASELINE:
        columns = {name: _drifting(rng, level) for name, level in BASELINE_METRICS.items()}
    elif condition is Condition.REWARD_HACKING:
        columns = _hacking(rng)
    else:
        columns = {name: _segments(rng, palette, (1, 2, 3, 5, 8, 20, 60))
                   for name, palette in PALETTES.items()}
    holes = {name: rng.random(STEPS) < 0.03 for name in columns}
    for name in columns:  # a few longer holes too
        for start in rng.integers(0, STEPS, 3):
            holes[name][start:start + int(rng.integers(2, 12))] = True
    builder = RowsBuilder()
    for i in range(STEPS):
        builder.add(i + 1, {name: float(values[i]) for name, values in columns.items()
                            if not holes[name][i]})
    rows = builder.build()
    assert isinstance(rows, ColumnRows)
    return RecordView(rows, {name: name for name in columns}, "log", "actor")


def test_every_condition_has_one_kind_and_examples_here() -> None:
    """A new condition cannot be judged by some paths and forgotten by others: the registry
    refuses it at import without a kind, and this tester without examples."""
    assert set(CONDITIONS) == set(Condition)
    assert all(kind.condition is condition for condition, kind in CONDITIONS.items())
    assert set(EXAMPLES) == set(Condition)
    assert all(rule.condition is condition for condition, rules in EXAMPLES.items()
               for rule in rules)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("condition", list(Condition), ids=str)
def test_live_and_long_log_paths_agree(condition: Condition, seed: int,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # the baseline's batch predictions on these short logs too, in many uneven blocks
    monkeypatch.setattr(baseline_batch, "MIN_SERIES", 100)
    monkeypatch.setattr(baseline_batch, "_BLOCK", 37)
    rules = EXAMPLES[condition]
    records = _log(condition, 100 * seed + list(Condition).index(condition))

    live = AlertEngine(rules)
    live_events = [(i, e) for i, record in enumerate(records) for e in live.evaluate(record)]

    quiet = AlertEngine(rules)
    judged = 0
    evaluate_rules = quiet.evaluate_rules

    def counted(record: StepRecord, some: list[Rule]) -> list[AlertEvent]:
        nonlocal judged
        judged += len(some)
        return evaluate_rules(record, some)

    monkeypatch.setattr(quiet, "evaluate_rules", counted)
    quiet_events = [(i, e) for i, events in evaluate_quietly(quiet, records) for e in events]

    assert repr(quiet_events) == repr(live_events)  # NaN values: equal as written
    assert repr(quiet.states) == repr(live.states)
    assert quiet.last_step == live.last_step

    # the engine's own batch path too (a long batch's baseline predictions prepared at once)
    batch = AlertEngine(rules)
    batch_events = [(i, e) for i, (_, events) in enumerate(evaluate_in_order(batch, records))
                    for e in events]
    assert repr(batch_events) == repr(live_events)
    assert repr(sorted(batch.states.items())) == repr(sorted(live.states.items()))
    if condition is Condition.REWARD_HACKING:  # judged wherever a reward and a length are
        assert judged < len(records), "the steps without a length were judged"
    else:
        assert judged < 0.9 * len(rules) * len(records), "the batch half skipped little"
    if condition in NOT_ON_LOGS:
        assert not live_events
        assert all(r.complete and not r.replica_mismatches and r.straggler is None
                   for r in records)
    else:  # the logs cross the condition both ways: the comparison is not vacuous
        assert {e.state for _, e in live_events} == {"firing", "resolved"}, live_events[:3]
    if condition is Condition.BASELINE:
        assert any(s.ahead is not None for s in quiet.states.values()), "no batch predictions"


def _rules_everywhere() -> list[Rule]:
    pack = {r.name: r for r in default_rules()}
    return list(pack.values()) + [r for rules in EXAMPLES.values() for r in rules
                                  if r.name not in pack]


@pytest.mark.parametrize("rule", _rules_everywhere(), ids=lambda r: r.name)
def test_every_rule_is_exported_or_says_why_and_has_a_doc_line(rule: Rule) -> None:
    exported = kind_of(rule).promql(rule)
    text = render([rule], monitor=False)
    if isinstance(exported, PromQL):
        assert exported.expr and f"expr: {exported.expr}" in text
    else:
        assert isinstance(exported, RlmonOnly)
        assert "expr:" not in text and rule.name in text  # named in the header, left out
    words = rule.describe()
    assert words and words in conditions_markdown([rule])


def test_the_docs_table_covers_the_default_pack() -> None:
    table = conditions_markdown()
    for rule in default_rules():
        assert f"| `{rule.name}` | {rule.severity.value} | {rule.describe()} |" in table


def test_rlmon_only_rules_of_the_pack_are_the_stateful_and_unexported_ones() -> None:
    """What the pack leaves to rlmon alone, by reason: the early warnings keep per-run state,
    the straggler reads timelines, two liveness conditions read open spans."""
    reasons = {r.name: kind_of(r).promql(r) for r in default_rules()}
    left = {name: why for name, why in reasons.items() if isinstance(why, RlmonOnly)}
    assert {name for name, why in left.items() if why is RlmonOnly.RUN_STATE} == {
        r.name for r in early_warning_rules()}
    assert {name for name, why in left.items() if why is RlmonOnly.TIMELINES} == {"StragglerRank"}
    assert {name for name, why in left.items() if why is RlmonOnly.OPEN_SPANS} == {
        "StageStuck", "StepTimeRegression"}


def test_the_paths_dispatch_through_the_registry_and_name_no_condition() -> None:
    """The long-log path, the liveness alerts and the Prometheus export hold no meaning of
    their own for any condition: each asks the condition's kind."""
    import ast
    from pathlib import Path

    import rlmon

    root = Path(rlmon.__file__).parent / "service"
    for module in ("alerting/quiet_steps.py", "alerting/liveness_alerts.py",
                   "export/prometheus_rules.py"):
        tree = ast.parse((root / module).read_text(encoding="utf-8"))
        named = [f"{module}:{node.lineno}: Condition.{node.attr}" for node in ast.walk(tree)
                 if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                 and node.value.id == "Condition"]
        assert named == []


# --- the same, over arbitrary short columns (hypothesis): the batch half never skips a step
# on which the live check would have counted towards firing -----------------------------------

_VALUES = st.one_of(
    st.none(),  # not logged at this step
    st.sampled_from([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, 2.0, 10.0, 0.5, -0.5, 9.0, 11.0,
                     0.7, 0.3, 1.2, -0.1]),
    st.floats(-30.0, 30.0, allow_nan=False))
_VECTOR_KINDS = [Condition.THRESHOLD, Condition.OUTSIDE, Condition.NON_FINITE,
                 Condition.OUT_OF_DOMAIN, Condition.STUCK, Condition.TREND]


@pytest.mark.parametrize("condition", _VECTOR_KINDS, ids=str)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_short_log_is_judged_alike(condition: Condition, data: st.DataObject) -> None:
    names = sorted({r.metric for r in EXAMPLES[condition]} - {"*"} | {c.CLIP_RATIO})
    columns = {name: data.draw(st.lists(_VALUES, min_size=12, max_size=12), label=name)
               for name in names}
    builder = RowsBuilder()
    for i in range(12):
        builder.add(i + 1, {name: float(v) for name, values in columns.items()
                            if (v := values[i]) is not None})
    rows = builder.build()
    assert isinstance(rows, ColumnRows)
    records = RecordView(rows, {name: name for name in names}, "log", "actor")
    live = AlertEngine(EXAMPLES[condition])
    live_events = [(i, e) for i, record in enumerate(records) for e in live.evaluate(record)]
    quiet = AlertEngine(EXAMPLES[condition])
    quiet_events = [(i, e) for i, events in evaluate_quietly(quiet, records) for e in events]
    assert repr(quiet_events) == repr(live_events)
    assert repr(quiet.states) == repr(live.states)
