"""Rendering and routing: Block Kit grouping, PagerDuty v2 fields, severity routes, silences."""

from __future__ import annotations

import json

import pytest

from rlmon.service.alerting.engine import AlertEvent
from rlmon.service.alerting.notify.routing import route
from rlmon.service.config import Settings, Silence
from rlmon.service.metrics import catalog

HOOK = "https://hooks.slack.com/services/T0AAAA/B0BBBB/abcdefSECRETxyz"
KEY = "0123456789abcdef0123456789abcdef"


def event(alert: str, severity: str = "critical", state: str = "firing", step: int = 7,
          metric: str = "actor/is_ratio", value: float | None = 2.5,
          run: str = "grpo-7b") -> AlertEvent:
    spec = catalog.lookup(metric)
    return AlertEvent(run=run, role="actor", step=step, alert=alert, severity=severity,
                      state=state,  # type: ignore[arg-type]
                      metric=metric, value=value, summary=f"{alert} summary",
                      condition=f"{metric} outside [0.5, 2]",
                      what_to_check=spec.what_to_check if spec else "")


@pytest.fixture
def settings(monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setenv("RLMON_SLACK_WEBHOOK_URL", HOOK)
    monkeypatch.setenv("RLMON_PAGERDUTY_ROUTING_KEY", KEY)
    return Settings(dashboard_url="https://grafana.example.com/d/x?var-run={run}")


def test_alerts_of_one_step_make_one_slack_message(settings: Settings) -> None:
    events = [event("ISRatioDivergence"),
              event("LogprobMismatch", "warning", metric="actor/logp_diff", value=0.4)]
    routed = route(events, settings, {"slack", "pagerduty"})
    slack = [n for n in routed.notifications if n.destination == "slack"]
    assert len(slack) == 1
    body = slack[0].body
    text = json.dumps(body)
    assert "ISRatioDivergence" in text
    assert "LogprobMismatch" in text
    assert "2 firing" in body["blocks"][0]["text"]["text"]
    assert catalog.get("actor/is_ratio").what_to_check[:40] in text
    assert "`actor/is_ratio` = *2.5*" in text
    assert "<https://grafana.example.com/d/x?var-run=grpo-7b|Open dashboard>" in text
    assert "step 7" in body["text"]


def test_pagerduty_gets_one_event_per_critical_alert(settings: Settings) -> None:
    events = [event("ISRatioDivergence"),
              event("LogprobMismatch", "warning", metric="actor/logp_diff", value=0.4)]
    routed = route(events, settings, {"slack", "pagerduty"})
    pd = [n for n in routed.notifications if n.destination == "pagerduty"]
    assert len(pd) == 1  # warnings go to Slack only
    body = pd[0].body
    assert body["event_action"] == "trigger"
    assert body["dedup_key"] == "grpo-7b/actor/ISRatioDivergence"
    payload = body["payload"]
    assert payload["severity"] == "critical"
    assert payload["source"] == "grpo-7b"
    assert payload["component"] == "actor"
    assert payload["class"] == "ISRatioDivergence"
    assert payload["group"] == "rlmon"
    assert payload["custom_details"]["step"] == 7
    assert payload["custom_details"]["value"] == "2.5"
    assert "routing_key" not in json.dumps(body)


def test_resolve_closes_the_same_incident(settings: Settings) -> None:
    routed = route([event("ISRatioDivergence", state="resolved", step=9)], settings,
                   {"slack", "pagerduty"})
    pd = next(n for n in routed.notifications if n.destination == "pagerduty")
    assert pd.body == {"event_action": "resolve", "dedup_key": "grpo-7b/actor/ISRatioDivergence"}
    assert pd.order_key == "grpo-7b/actor/ISRatioDivergence"
    slack = next(n for n in routed.notifications if n.destination == "slack")
    assert "resolved" in slack.body["blocks"][0]["text"]["text"]


def test_stored_bodies_hold_no_secret(settings: Settings) -> None:
    routed = route([event("ISRatioDivergence")], settings, {"slack", "pagerduty"})
    for notification in routed.notifications:
        text = notification.body_json()
        assert KEY not in text
        assert "SECRET" not in text


def test_silences_and_unconfigured_destinations(settings: Settings) -> None:
    settings.silences = [Silence(run="grpo-*", alert="ISRatioDivergence")]
    fired = route([event("ISRatioDivergence")], settings, {"slack", "pagerduty"})
    assert fired.notifications == []
    assert fired.silenced == 1
    resolved = route([event("ISRatioDivergence", state="resolved")], settings,
                     {"slack", "pagerduty"})
    assert [n.destination for n in resolved.notifications] == ["pagerduty"]
    unrouted = route([event("EntropyCollapse", metric="actor/entropy")], settings, {"slack"})
    assert unrouted.unroutable == {"pagerduty": 1}
    assert [n.destination for n in unrouted.notifications] == ["slack"]


def test_nan_value_renders(settings: Settings) -> None:
    routed = route([event("NonFiniteMetric", metric="actor/loss", value=float("nan"))], settings,
                   {"pagerduty"})
    body = routed.notifications[0].body
    assert body["payload"]["custom_details"]["value"] == "NaN"
    json.dumps(body, allow_nan=False)
