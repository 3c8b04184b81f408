"""What a person receives (issue 30), on replay-style step sequences with simulated time: a
metric flapping near its threshold is one alert, a warning escalates once to critical (routed by
the new severity), a still-firing critical alert is re-sent at the repeat interval, the per-hour
bound holds notifications back and says so once, and the engine's state survives the history
store."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from rlmon.service.alerting.engine import AlertEngine, AlertEvent, NotifyPolicy
from rlmon.service.alerting.notify.routing import route
from rlmon.service.alerting.rules import Rule, default_rules
from rlmon.service.config import Settings
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.metrics import catalog
from rlmon.service.storage.history import HistoryStore
from tests.support.records import step_record

LOGP = "actor/logp_diff"
T0 = 1_800_000_000.0  # the first step's time (unix seconds): the engine's clock is the steps'
PERIOD = 30.0


def rule_named(name: str) -> Rule:
    return next(r for r in default_rules() if r.name == name)


def records(values: Iterable[float], metric: str = LOGP, period: float = PERIOD,
            start: int = 0) -> list[StepRecord]:
    return [step_record(step=start + i, metrics={metric: v}, time=T0 + (start + i) * period)
            for i, v in enumerate(values)]


def run(engine: AlertEngine, recs: Sequence[StepRecord]) -> list[AlertEvent]:
    return [e for r in recs for e in engine.evaluate(r)]


def test_a_metric_flapping_near_its_threshold_is_one_alert() -> None:
    # the off-policy run: actor/logp_diff around LogprobMismatch's 0.1, over and under
    # it step after step (it fired and resolved 86-97 times a run before the hysteresis)
    rng = np.random.default_rng(3)
    values = [float(v) for v in 0.1 + 0.012 * rng.standard_normal(400)]
    assert sum(v > 0.1 for v in values) > 150  # it does cross, often
    events = run(AlertEngine([rule_named("LogprobMismatch")]), records(values))
    assert [(e.state, e.severity) for e in events] == [("firing", "warning")]


def test_a_condition_that_ends_resolves_after_resolve_after_good_steps() -> None:
    mismatch = rule_named("LogprobMismatch")
    good = mismatch.resolve_steps
    values = [0.2] * 5 + [0.02] * (good + 5)
    events = run(AlertEngine([mismatch]), records(values))
    assert [(e.step, e.state) for e in events] == [(mismatch.for_steps - 1, "firing"),
                                                   (5 + good - 1, "resolved")]


def test_a_warning_that_climbs_escalates_once_routed_by_its_new_severity() -> None:
    # `make demo`'s drift: 0.11 to 0.55 over 24 steps (before: only the warning at 0.11)
    values = [0.02] * 10 + [0.11 + (0.55 - 0.11) * i / 23 for i in range(24)]
    engine = AlertEngine([rule_named("LogprobMismatch")])
    events = run(engine, records(values))
    assert [(e.state, e.severity, e.escalated_from) for e in events] == [
        ("firing", "warning", ""), ("firing", "critical", "warning")]
    _, escalation = events
    assert escalation.value is not None and escalation.value >= 0.3 > values[escalation.step - 1]
    assert "escalated to critical" in escalation.summary
    assert engine.state("r", "actor", "LogprobMismatch").severity == "critical"  # type: ignore[union-attr]
    routed = route(events, Settings(), {"slack", "pagerduty"})
    pagerduty = [n for n in routed.notifications if n.destination == "pagerduty"]
    assert len(pagerduty) == 1 and pagerduty[0].body["payload"]["severity"] == "critical"
    # the resolve is routed by the severity it reached: PagerDuty closes what it opened
    resolved = run(engine, records([0.01] * 20, start=len(values)))
    assert [(e.state, e.severity) for e in resolved] == [("resolved", "critical")]
    assert [n.destination for n in route(resolved, Settings(), {"slack", "pagerduty"})
            .notifications] == ["pagerduty", "slack"]


def test_a_warning_that_lasts_escalates_by_duration() -> None:
    rule = rule_named("RewardStuck")
    assert rule.escalate_after is not None
    steps = rule.for_steps + rule.escalate_after + 5
    events = run(AlertEngine([rule]), records([0.0] * steps, metric=catalog.REWARD))
    assert [(e.step, e.severity) for e in events] == [
        (rule.for_steps - 1, "warning"), (rule.for_steps - 1 + rule.escalate_after, "critical")]
    assert "firing for" in events[1].summary


def test_a_value_past_the_critical_bound_on_every_step_it_took_to_fire_is_critical_at_once(
        ) -> None:
    events = run(AlertEngine([rule_named("KLDivergence")]),
                 records([1.0] * 5 + [1.1e4] * 3, metric=catalog.KL))
    assert [(e.step, e.state, e.severity, e.escalated_from) for e in events] == [
        (5 + rule_named("KLDivergence").for_steps - 1, "firing", "critical", "")]
    assert events[0].condition.startswith("actor/kl > 10")


def test_one_step_that_jumps_past_the_critical_bound_is_a_warning() -> None:
    """From quiet straight past the critical level on a rule that fires on one step: a warning,
    critical a step later only if it is still there (quoting the first step). One step of a
    noisy mean past the bound is a spike: a small batch's token-mean logprob difference at 14x
    its median for one step was paged as critical on a healthy run (the default pack's
    LogprobMismatch now waits for a second step: a rule file's copy that fires on one)."""
    mismatch = rule_named("LogprobMismatch").model_copy(update={"for_steps": 1})
    events = run(AlertEngine([mismatch]), records([0.02] * 5 + [0.39] + [0.03] * 30))
    assert [(e.step, e.state, e.severity) for e in events] == [
        (5, "firing", "warning"), (5 + mismatch.resolve_steps, "resolved", "warning")]
    events = run(AlertEngine([mismatch]), records([0.02] * 5 + [0.39, 0.35] + [0.03] * 30))
    assert [(e.step, e.state, e.severity, e.escalated_from) for e in events][:2] == [
        (5, "firing", "warning", ""), (6, "firing", "critical", "warning")]
    assert "crossed the critical level 0.3 at step 5" in events[1].summary


def test_a_still_firing_critical_alert_is_re_sent_at_the_repeat_interval() -> None:
    policy = NotifyPolicy(repeat_seconds=3600.0)
    engine = AlertEngine([rule_named("LogprobDivergence")], policy)
    events = run(engine, records([2.0] * 300))  # 300 steps of 30 s: 2.5 h in simulated time
    assert [(e.step, e.repeat) for e in events] == [(0, False), (120, True), (240, True)]
    assert all(e.severity == "critical" and e.notify for e in events)
    assert "still firing since step 0" in events[1].summary


def test_a_warning_is_never_re_sent() -> None:
    events = run(AlertEngine([rule_named("LogprobMismatch")], NotifyPolicy(repeat_seconds=60)),
                 records([0.2] * 100))
    assert len(events) == 1


def test_the_per_hour_bound_holds_notifications_back_and_says_so_once() -> None:
    # a rule without hysteresis that flaps every other step: the bound is the last line
    flappy = Rule.model_validate({"name": "Flappy", "severity": "warning",
                                  "condition": "threshold", "metric": LOGP, "op": ">",
                                  "threshold": 0.1})
    engine = AlertEngine([flappy], NotifyPolicy(per_hour=6))
    events = run(engine, records([0.2, 0.0] * 40, period=60.0))  # 80 steps, 80 minutes
    sent = [e for e in events if e.notify]
    said = [e for e in sent if "the most it sends" in e.summary]
    assert len(events) == 80  # every transition is still stored
    first_hour = [e for e in sent if e.step < 60]
    assert len(first_hour) == 6 and [e for e in said if e.step < 60] == [first_hour[-1]]
    # an hour after the first notification it may send again
    assert [e.step for e in sent if e.step >= 60][:1] == [60]
    routed = route(events[:60], Settings(), {"slack"})
    assert routed.held == 54 and len(routed.notifications) == 6


def test_a_held_firing_holds_its_resolve_back_too() -> None:
    flappy = Rule.model_validate({"name": "Flappy", "severity": "warning",
                                  "condition": "threshold", "metric": LOGP, "op": ">",
                                  "threshold": 0.1})
    engine = AlertEngine([flappy], NotifyPolicy(per_hour=2))
    events = run(engine, records([0.2, 0.0, 0.2, 0.0], period=60.0))
    assert [(e.state, e.notify) for e in events] == [
        ("firing", True), ("resolved", True), ("firing", False), ("resolved", False)]


def test_escalation_state_and_pre_onset_level_survive_the_history_store(tmp_path: Path) -> None:
    rules = [rule_named("LogprobMismatch"), rule_named("EntropySliding")]
    engine = AlertEngine(rules)
    rng = np.random.default_rng(0)
    entropy = [float(v) for v in 0.4 * (1 + 0.03 * rng.standard_normal(40))] + [0.05] * 10
    recs = [step_record(step=i, time=T0 + i * PERIOD, metrics={
        LOGP: 0.5 if i >= 40 else 0.02, catalog.ENTROPY: entropy[i]}) for i in range(50)]
    run(engine, recs)
    store = HistoryStore(tmp_path / "h.sqlite")
    store.add(recs, states=engine.stream_states("r", "actor"))
    store.close()
    restored = HistoryStore(tmp_path / "h.sqlite").alert_states()
    mine = engine.stream_states("r", "actor")
    assert restored == mine
    slide = restored[("r", "actor", "EntropySliding")]
    assert slide.firing and slide.reference is not None
    assert restored[("r", "actor", "LogprobMismatch")].severity == "critical"
    # fired at step 41, its second step over: critical at once, past the critical level on
    # both steps it took to fire
    assert list(restored[("r", "actor", "LogprobMismatch")].sent) == [T0 + 41 * PERIOD]
    assert restored[("r", "actor", "LogprobMismatch")].critical_since == 40


def test_every_default_rule_has_a_critical_level_or_says_why_not() -> None:
    for rule in default_rules():
        if rule.severity.value == "critical":
            assert rule.name not in catalog.NO_CRITICAL, rule.name
            continue
        escalates = any(level is not None for level in (
            rule.critical, rule.escalate_after, rule.critical_drop, rule.critical_pinned))
        assert escalates != (rule.name in catalog.NO_CRITICAL), rule.name


def test_one_owner_forgets_a_stream_wholly() -> None:
    engine = AlertEngine([rule_named("LogprobMismatch")])
    run(engine, records([0.2] * 3))
    assert engine.streams() == {("r", "actor")} and engine.is_firing("r", "actor", "LogprobMismatch")
    engine.forget_streams([("r", "actor")])
    assert engine.streams() == set() and engine.stream_states("r", "actor") == {}
    assert engine.attempt_of("r", "actor") == 0


def test_a_stalled_run_still_stalled_is_re_sent_at_the_repeat_interval() -> None:
    from dataclasses import replace

    from rlmon.service.alerting.liveness_alerts import liveness_events
    from rlmon.service.liveness.run_state import LivenessView, RunState

    engine = AlertEngine(default_rules(), NotifyPolicy(repeat_seconds=3600.0))
    view = LivenessView("q", "actor", RunState.STALLED, since=T0 - 10.0, at=T0, last_step=9,
                        last_step_at=T0 - 100.0, last_heard=T0, period=2.0, threshold=90.0,
                        ranks=2, heartbeats=True)
    sent = []
    for minutes in range(0, 150, 10):  # the timer's refresh, every 10 simulated minutes
        sent += [(minutes, e.alert, e.repeat) for e in
                 liveness_events(engine, replace(view, at=T0 + 60.0 * minutes)) if e.notify]
    assert sent == [(0, "RunStalled", False), (60, "RunStalled", True),
                    (120, "RunStalled", True)]
