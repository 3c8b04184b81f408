"""Rendering and routing: Block Kit grouping, PagerDuty v2 fields, severity routes, silences."""

from __future__ import annotations

import io
import json
from dataclasses import replace

import pytest

from rlmon.service.alerting.engine import AlertEvent
from rlmon.service.alerting.notify.console import ConsoleNotifier
from rlmon.service.alerting.notify.render import alert_url, summary_line, webhook_body
from rlmon.service.alerting.notify.routing import route
from rlmon.service.config import ConfigError, Settings, Silence, load_config
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
    settings = Settings(dashboard_url="https://grafana.example.com/d/x?var-run={run}")
    # each step's message rendered by route (grouped, Slack's and the webhook's are rendered
    # when their run's group goes; a group of one step is this same message: test_notify_grouping)
    settings.notifiers.grouping.enabled = False
    return settings


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


# --- links to the run page, what to change, what moved first (issue 30) -------------------------

PAGE = "https://rlmon.example.com/"
MOVED = ("`actor/logp_diff` rose 4 steps before `actor/is_ratio_min` fell: look at the weight "
         "sync first")


def stale(framework: str = "verl", state: str = "firing", run: str = "grpo 7b/a") -> AlertEvent:
    return replace(event("ISRatioStale", "critical", state, step=48, metric="actor/is_ratio_min",
                         value=0.05, run=run), framework=framework, first_moved=MOVED)


ALERT_URL = "https://rlmon.example.com/#/alert/grpo%207b%2Fa/actor/ISRatioStale/48"
RUN_URL = "https://rlmon.example.com/#/run/grpo%207b%2Fa?role=actor"
VERL_KEY = "`algorithm.rollout_correction.rollout_is_threshold` (2 to 5)"


def test_every_destination_links_to_the_alert_page_and_names_the_frameworks_keys(
        settings: Settings) -> None:
    settings.public_url = PAGE
    routed = route([stale()], settings, {"slack", "pagerduty", "webhook"})
    by = {n.destination: n.body for n in routed.notifications}
    slack = json.dumps(by["slack"])
    assert f"<{ALERT_URL}|Open in rlmon>" in slack
    assert f"<{RUN_URL}|Open run>" in slack
    assert "<https://grafana.example.com/d/x?var-run=grpo%207b%2Fa|Open dashboard>" in slack
    assert ":wrench: What to change (verl): The rollout engine samples" in slack
    assert VERL_KEY in slack
    assert f":footprints: What moved first: {MOVED}" in slack
    pd = by["pagerduty"]["payload"]["custom_details"]
    assert pd["alert_url"] == ALERT_URL
    assert VERL_KEY in pd["what_to_change"] and pd["framework"] == "verl"
    assert pd["first_moved"] == MOVED
    assert by["pagerduty"]["links"] == [
        {"href": ALERT_URL, "text": "rlmon: ISRatioStale on grpo 7b/a/actor"},
        {"href": RUN_URL, "text": "rlmon run page"},
        {"href": "https://grafana.example.com/d/x?var-run=grpo%207b%2Fa",
         "text": "rlmon dashboard"}]
    hook = webhook_body([stale()], None, public_url=PAGE)
    (line,) = hook["alerts"]
    assert line["alert_url"] == ALERT_URL and hook["run_url"] == RUN_URL
    assert VERL_KEY in line["what_to_change"] and line["first_moved"] == MOVED
    out = io.StringIO()
    ConsoleNotifier(out).send(hook)
    console = out.getvalue()
    assert "\n    what to change (verl): The rollout engine" in console
    assert f"\n    what moved first: {MOVED}\n" in console
    assert f"\n    rlmon: {ALERT_URL}\n" in console
    assert f"    run page: {RUN_URL}\n" in console


def test_the_keys_follow_the_detected_framework() -> None:
    keys = {fw: webhook_body([stale(fw)], None)["alerts"][0]["what_to_change"]
            for fw in ("verl", "openrlhf", "skyrl", "trl", "")}
    assert "`--algo.advantage.is_correction_level` (token)" in keys["openrlhf"]
    assert "`trainer.algorithm.off_policy_correction.tis_ratio_type` (token)" in keys["skyrl"]
    assert "`vllm_importance_sampling_clip_max` (2 to 5 (default 3.0))" in keys["trl"]
    assert "`" not in keys[""] and "weight sync" in keys[""]  # a home-grown loop: plain words
    assert len(set(keys.values())) == 5


def test_without_a_public_url_nothing_links_to_rlmon_and_a_resolve_links_its_latest_firing(
        settings: Settings) -> None:
    routed = route([stale()], settings, {"slack", "pagerduty"})
    text = json.dumps([n.body for n in routed.notifications])
    assert "rlmon.example.com" not in text and "Open in rlmon" not in text
    assert "alert_url" not in text
    assert "Open dashboard" in text  # the dashboard link stays
    resolved = stale(state="resolved")
    assert alert_url(resolved, PAGE) == (
        "https://rlmon.example.com/#/alert/grpo%207b%2Fa/actor/ISRatioStale")
    escalated = replace(stale(), escalated_from="warning")
    assert summary_line(escalated).startswith(
        "[CRITICAL, escalated from warning] ISRatioStale on grpo 7b/a/actor step 48")
    # a re-send is not stored at its step: it opens the latest firing too
    assert alert_url(replace(stale(), step=90, repeat=True), PAGE) == alert_url(resolved, PAGE)
    (line,) = webhook_body([resolved], None, public_url=PAGE)["alerts"]
    assert line["what_to_change"] == "" and line["first_moved"] == ""  # said at the firing


def test_a_closing_because_the_run_ended_or_a_hand_over_is_never_a_plain_resolve(
        settings: Settings) -> None:
    """What every destination reads of a resolve that is not a recovery: the run ended with
    the alert firing (no value: none was measured then), or an early warning handed over to
    its level rule."""
    ended = replace(stale(state="resolved"), value=None, ended_with_run=True)
    assert summary_line(ended) == ("[CRITICAL, still firing when the run ended] ISRatioStale on "
                                   "grpo 7b/a/actor step 48: actor/is_ratio_min "
                                   "(actor/is_ratio_min outside [0.5, 2])")
    out = io.StringIO()
    ConsoleNotifier(out).send(webhook_body([ended], None))
    assert out.getvalue().startswith("[CRITICAL, still firing when the run ended] ISRatioStale")
    (line,) = webhook_body([ended], None)["alerts"]
    assert line["state"] == "resolved" and line["ended_with_run"] is True  # the contract's state
    routed = route([ended], settings, {"slack"})
    slack = json.dumps([n.body for n in routed.notifications])
    assert "(critical, still firing when the run ended)" in slack and "(resolved)" not in slack
    handed = replace(event("EntropySliding", "warning", "resolved", step=60,
                           metric="actor/entropy", value=0.02), handed_to="EntropyCollapse")
    assert summary_line(handed).startswith(
        "[HANDED OVER to EntropyCollapse] EntropySliding on grpo-7b/actor step 60: "
        "actor/entropy = 0.02")
    assert summary_line(handed).endswith(": EntropyCollapse judges this level and fires now")
    routed = route([handed], settings, {"slack"})
    slack = json.dumps([n.body for n in routed.notifications])
    assert "(handed over to EntropyCollapse)" in slack and "(resolved)" not in slack


def test_public_url_is_checked() -> None:
    assert load_config(public_url="https://rlmon.example.com/x/").run_page() == (
        "https://rlmon.example.com/x")
    for bad in ("rlmon.example.com", "https://rlmon.example.com/?a=1", "ftp://x"):
        with pytest.raises(ConfigError, match="public_url"):
            load_config(public_url=bad)
