"""End to end with real parts on loopback: our exporter serving a replayed run, Debian's Prometheus
scraping it and evaluating the generated rules, Debian's Alertmanager routing to a receiver that
accepts the Slack webhook, PagerDuty Events v2 and webhook shapes. Intervals are 1 s.

What Alertmanager promises about repeats, and so what these tests assert (Alertmanager 0.25, the
Debian package; https://prometheus.io/docs/alerting/0.25/configuration/#route, the ``group_wait``,
``group_interval`` and ``repeat_interval`` entries, and
https://prometheus.io/docs/alerting/latest/high_availability/):

* a group's first notification waits ``group_wait``; after it, Alertmanager notifies the group again
  at a ``group_interval`` tick whenever the group's set of firing alerts changed (or, with
  ``send_resolved``, its set of resolved alerts), and re-sends an unchanged group after
  ``repeat_interval``; delivery is at least once (a failed send is retried, a restart re-sends);
* so the number of notifications per incident is NOT promised. Two alerts of one group that fire
  in one evaluation reach Alertmanager in separate batches (Prometheus sends per rule), and when
  they resolve in one evaluation a ``group_interval`` tick can fall between the two resolved
  updates: the group is then notified with one alert still firing and one resolved, which
  PagerDuty receives as a second ``trigger``. That is how the old ``len(triggers) == 1`` failed;
* what is promised for PagerDuty: every event of one group carries the same ``dedup_key`` (the hash
  of the group key: ``DedupKey: key.Hash()`` in notify/pagerduty/pagerduty.go), and PagerDuty keeps
  one incident per ``dedup_key``; ``event_action`` is ``trigger`` while any alert of the group
  fires and ``resolve`` once all are resolved; one group's notifications go out one after the
  other (the aggregation group flushes synchronously), so once the group has resolved and nothing
  fires again, no trigger follows the resolve. Every notification lists the whole group, so one
  of them lists both critical alerts as firing.

The tests assert exactly that: at least one trigger, one dedup_key for every event of the critical
group, a trigger listing both critical alerts, the resolve carrying that key, no trigger after the
first resolve, and the same for the other receivers (the webhook and Slack get every group's
notifications; a warning never reaches PagerDuty and is never grouped with the critical alerts).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rlmon.service.export.exporter import MetricsState
from rlmon.service.export.http import serve_metrics
from rlmon.service.export.prometheus_rules import render
from rlmon.service.replay import replay
from tests.support.alerting_support import PromStack, Receiver, need_binary, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CRITICAL = {"ISRatioDivergence", "LogprobDivergence"}
WARNING = {"LogprobMismatch"}
PATIENCE = 60.0  # seconds; generous: the intervals are 1 s, the rest is load we do not control


def replayed_run() -> list[list]:  # type: ignore[type-arg]
    """Steps 0-1 healthy, step 2 diverges (IS ratio 3.0, logprob diff 1.5), step 3 recovers."""
    lines = []
    for step, (ratio, diff) in enumerate([(1.0, 0.01), (1.02, 0.02), (3.0, 1.5), (1.0, 0.01)]):
        for dp in range(2):
            lines.append(json.dumps({
                "run": "grpo-7b", "role": "actor", "step": step, "rank": {"dp": dp},
                "world": {"dp": 2},
                "metrics": {"actor/is_ratio": {"sum": ratio * 100, "count": 100},
                            "actor/logp_diff": {"sum": diff * 100, "count": 100}}}))
    result = replay(lines)
    assert not result.errors
    return [[record, events] for record, events in result.steps]


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[tuple[MetricsState, Receiver, PromStack]]:
    prometheus = need_binary("prometheus")
    alertmanager = need_binary("prometheus-alertmanager")
    receiver = Receiver().start()
    state = MetricsState()
    server = serve_metrics(state, port=0, host="127.0.0.1")
    # the training alerts alone: the always-firing Watchdog is test_the_monitors_own_rules'
    rules = render(step_period=1.0, interval="1s", monitor=False)
    prom = PromStack(tmp_path, server.port, receiver.url, rules)
    try:
        prom.start(prometheus, alertmanager)
        yield state, receiver, prom
    finally:
        prom.stop()
        server.close()
        receiver.stop()


def named(text: str, names: set[str]) -> set[str]:
    return {name for name in names if name in text}


def pd_events(receiver: Receiver) -> list[dict[str, Any]]:
    """PagerDuty events in the order Alertmanager sent them (it waits for each answer)."""
    return [r.body for r in receiver.accepted("/v2/enqueue")]


def pd_firing(event: dict[str, Any]) -> set[str]:
    return named(str(event["payload"]["custom_details"].get("firing", "")), CRITICAL | WARNING)


def slack_messages(receiver: Receiver) -> list[tuple[str, str]]:
    """(color, text) of every Slack attachment: color "danger" while firing, "good" resolved."""
    return [(a.get("color", ""), json.dumps(a)) for r in receiver.accepted("/slack")
            for a in r.body["attachments"]]


def describe(receiver: Receiver) -> str:
    """What arrived, for failure messages."""
    return "\n".join(f"{r.path.split('/')[1]} {json.dumps(r.body)[:300]}"
                     for r in receiver.accepted("/"))


def test_alerts_fire_group_and_resolve_through_alertmanager(
    stack: tuple[MetricsState, Receiver, PromStack],
) -> None:
    state, receiver, prom = stack
    steps = replayed_run()
    for record, events in steps[:2]:
        state.update(record, events)
    wait_for(lambda: prom.query('rlmon_step{run="grpo-7b"} == 1'), PATIENCE,
             "the healthy steps scraped")
    assert receiver.requests == []

    bad, events = steps[2]
    state.update(bad, events)
    # every notification lists the whole group, so one trigger lists both critical alerts
    trigger = wait_for(
        lambda: next((e for e in pd_events(receiver)
                      if e["event_action"] == "trigger" and pd_firing(e) == CRITICAL), None),
        PATIENCE, "a PagerDuty trigger listing both critical alerts")
    key = trigger["dedup_key"]
    hook = wait_for(
        lambda: next((r.body for r in receiver.accepted("/hook") if r.body["status"] == "firing"
                      and {a["labels"]["alertname"] for a in r.body["alerts"]} == CRITICAL), None),
        PATIENCE, "a webhook listing both critical alerts")
    assert hook["groupLabels"] == {"run": "grpo-7b", "role": "actor"}
    assert {a["labels"]["severity"] for a in hook["alerts"]} == {"critical"}
    wait_for(lambda: [t for c, t in slack_messages(receiver) if c == "danger" and named(t, WARNING)]
             and [t for c, t in slack_messages(receiver) if c == "danger" and named(t, CRITICAL)],
             PATIENCE, "Slack messages for the warning and the critical group")

    good, events = steps[3]
    state.update(good, events)
    resolve = wait_for(
        lambda: next((e for e in pd_events(receiver) if e["event_action"] == "resolve"), None),
        PATIENCE, "the PagerDuty resolve")
    assert resolve["dedup_key"] == key
    wait_for(lambda: [r for r in receiver.accepted("/hook") if r.body["status"] == "resolved"],
             PATIENCE, "the resolved webhook")
    wait_for(lambda: [t for c, t in slack_messages(receiver) if c == "good" and named(t, WARNING)]
             and [t for c, t in slack_messages(receiver) if c == "good" and named(t, CRITICAL)],
             PATIENCE, "resolved Slack messages for both groups")
    # nothing fires any more, in Prometheus or in Alertmanager: no further notification can come
    wait_for(lambda: prom.query("ALERTS") == [], PATIENCE, "no alert left in Prometheus")
    wait_for(lambda: prom.am_alerts() == [], PATIENCE, "no active alert left in Alertmanager")

    events_seen = pd_events(receiver)
    why = describe(receiver)
    assert {e["dedup_key"] for e in events_seen} == {key}, why  # one incident
    assert {e["routing_key"] for e in events_seen} == {prom.routing_key}, why
    actions = [e["event_action"] for e in events_seen]
    first_resolve = actions.index("resolve")
    assert first_resolve >= 1 and set(actions[:first_resolve]) == {"trigger"}, why
    assert set(actions[first_resolve:]) == {"resolve"}, why  # no trigger after the resolve
    assert all(pd_firing(e) <= CRITICAL for e in events_seen), why  # a warning never pages
    # the webhook gets the same group's notifications: firing ones first, then the resolve
    statuses = [r.body["status"] for r in receiver.accepted("/hook")]
    first_resolved = statuses.index("resolved")
    assert set(statuses[:first_resolved]) == {"firing"}, why
    assert set(statuses[first_resolved:]) == {"resolved"}, why
    assert all(r.body["groupLabels"] == hook["groupLabels"] for r in receiver.accepted("/hook"))
    # Slack: two groups, never mixed; each group's messages end resolved, none fires after that
    for names in (CRITICAL, WARNING):
        colors = [c for c, t in slack_messages(receiver) if named(t, names)]
        assert colors[0] == "danger" and colors[-1] == "good", why
        assert "danger" not in colors[colors.index("good"):], why
    assert not [t for _, t in slack_messages(receiver) if named(t, CRITICAL) and named(t, WARNING)]


def test_the_monitors_own_rules_page_through_alertmanager(tmp_path: Path) -> None:
    """The dead man's switch and the scrape target going down, on a real Prometheus and
    Alertmanager (issue 23): the Watchdog reaches a receiver while all is well; closing rlmon's
    /metrics pages RlmonDown (its `for` shortened from the exported 2m to keep this fast, but
    not below Prometheus' start-up on a loaded machine: before the first scrape lands, `up` is
    absent, which the rule rightly counts as down)."""
    import yaml

    from rlmon.service.export.prometheus_rules import monitor_rules

    prometheus = need_binary("prometheus")
    alertmanager = need_binary("prometheus-alertmanager")
    receiver = Receiver().start()
    server = serve_metrics(MetricsState(), port=0, host="127.0.0.1")
    rules = yaml.safe_dump({"groups": [{"name": "rlmon-monitor", "interval": "1s",
                                        "rules": monitor_rules("rlmon", down_for="15s")}]})
    prom = PromStack(tmp_path, server.port, receiver.url, rules)
    try:
        prom.start(prometheus, alertmanager)
        wait_for(lambda: [t for c, t in slack_messages(receiver) if "Watchdog" in t], PATIENCE,
                 "the Watchdog at the receiver while rlmon is up")
        wait_for(lambda: prom.query('up{job="rlmon"} == 1'), PATIENCE, "rlmon scraped")
        assert not [e for e in pd_events(receiver)], describe(receiver)  # nothing pages
        server.close()
        event = wait_for(lambda: next((e for e in pd_events(receiver)
                                       if e["event_action"] == "trigger"), None),
                         PATIENCE, "RlmonDown paged once rlmon's /metrics is gone")
        assert "RlmonDown" in json.dumps(event), describe(receiver)
    finally:
        prom.stop()
        server.close()
        receiver.stop()
