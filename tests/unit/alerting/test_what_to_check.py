"""What to check is chosen in one place (rlmon.service.alerting.what_to_check): the engine's
events, the liveness alerts and the Prometheus rules' descriptions say the same for every default
rule."""

from __future__ import annotations

from rlmon.service.alerting import rank_missing, reward_hacking
from rlmon.service.alerting.conditions.kind import Condition
from rlmon.service.alerting.conditions.registry import LIVENESS_CONDITIONS
from rlmon.service.alerting.engine import AlertEngine
from rlmon.service.alerting.liveness_alerts import liveness_events
from rlmon.service.alerting.rules import default_rules
from rlmon.service.alerting.what_to_check import what_to_check
from rlmon.service.export.prometheus_rules import translate
from rlmon.service.liveness.run_state import LivenessView, RunState
from rlmon.service.metrics import catalog

T0 = 1_700_000_000.0


def test_a_condition_that_speaks_for_itself_wins_over_its_metric() -> None:
    loss = catalog.get("actor/loss").what_to_check
    assert loss and what_to_check(None, "actor/loss") == loss
    assert what_to_check(Condition.THRESHOLD, "actor/loss") == loss
    assert what_to_check(Condition.REWARD_HACKING, "actor/loss") == reward_hacking.WHAT_TO_CHECK
    assert what_to_check(Condition.RANK_MISSING, "") == rank_missing.WHAT_TO_CHECK
    for spec in catalog.LIVENESS_ALERTS:
        assert what_to_check(Condition(spec.condition), "") == spec.what_to_check
    assert what_to_check(Condition.NON_FINITE, "*") == ""  # any metric: none in particular
    assert what_to_check(None, "my/own_metric") == ""


def test_every_prometheus_rule_says_what_the_engine_says() -> None:
    rules = default_rules()
    translated, _skipped = translate(rules, 60.0)
    by_name = {r.name: r for r in rules}
    assert translated
    for prom in translated:
        rule = by_name[prom.alert]
        hint = what_to_check(rule.condition, rule.metric)
        if hint:
            assert prom.description.endswith(". What to check: " + hint), prom.alert
        else:
            assert "What to check" not in prom.description, prom.alert
    rank = next(p for p in translated if p.alert == "RankMissing")
    assert rank.description.endswith(rank_missing.WHAT_TO_CHECK)


def test_a_liveness_alert_s_event_says_its_catalog_entry() -> None:
    engine = AlertEngine([r for r in default_rules() if r.condition in LIVENESS_CONDITIONS])
    view = LivenessView("r", "actor", RunState.DEAD, T0, T0, 3, T0 - 60, T0 - 1, 1.0, 90.0, 1,
                        heartbeats=True)
    (event,) = liveness_events(engine, view)
    spec = next(s for s in catalog.LIVENESS_ALERTS if s.name == event.alert)
    assert event.what_to_check == spec.what_to_check != ""
