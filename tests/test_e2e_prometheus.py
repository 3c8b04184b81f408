"""End to end with real parts on loopback: our exporter serving a replayed run, Debian's Prometheus
scraping it and evaluating the generated rules, Debian's Alertmanager routing to a receiver that
accepts the Slack webhook, PagerDuty Events v2 and webhook shapes. Intervals are 1 s."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from alerting_support import PromStack, Receiver, need_binary, wait_for

from rlmon.service.exporter import MetricsState
from rlmon.service.metrics_http import serve_metrics
from rlmon.service.prom_rules import render
from rlmon.service.replay import replay

pytestmark = [pytest.mark.integration, pytest.mark.slow]


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
    rules = render(step_period=1.0, interval="1s")
    prom = PromStack(tmp_path, server.port, receiver.url, rules)
    try:
        prom.start(prometheus, alertmanager)
        yield state, receiver, prom
    finally:
        prom.stop()
        server.close()
        receiver.stop()


def test_alerts_fire_group_and_resolve_through_alertmanager(
    stack: tuple[MetricsState, Receiver, PromStack],
) -> None:
    state, receiver, prom = stack
    steps = replayed_run()
    for record, events in steps[:2]:
        state.update(record, events)
    wait_for(lambda: prom.query('rlmon_step{run="grpo-7b"} == 1'), 20, "the healthy steps scraped")
    assert receiver.requests == []

    bad, events = steps[2]
    state.update(bad, events)
    pd = wait_for(lambda: receiver.accepted("/v2/enqueue"), 30, "a PagerDuty trigger")
    trigger = pd[0].body
    assert trigger["event_action"] == "trigger"
    # both critical alerts of the (run, role) arrive as one grouped incident
    assert trigger["payload"]["custom_details"]["num_firing"] == "2"
    firing = trigger["payload"]["custom_details"]["firing"]
    assert "ISRatioDivergence" in firing
    assert "LogprobDivergence" in firing
    hook = wait_for(lambda: receiver.accepted("/hook"), 10, "the webhook")[0].body
    assert hook["groupLabels"] == {"run": "grpo-7b", "role": "actor"}
    assert sorted(a["labels"]["alertname"] for a in hook["alerts"]) == [
        "ISRatioDivergence", "LogprobDivergence"]
    assert {a["labels"]["severity"] for a in hook["alerts"]} == {"critical"}
    slack = wait_for(lambda: len(receiver.accepted("/slack")) >= 2 and receiver.accepted("/slack"),
                     10, "Slack messages for the critical and the warning group")
    texts = [json.dumps(r.body) for r in slack]
    assert any("LogprobMismatch" in t for t in texts)  # the warning went to Slack ...
    assert not any("LogprobMismatch" in json.dumps(r.body) for r in pd)  # ... not to PagerDuty

    good, events = steps[3]
    state.update(good, events)
    resolve = wait_for(
        lambda: [r for r in receiver.accepted("/v2/enqueue")
                 if r.body["event_action"] == "resolve"], 30, "the PagerDuty resolve")[0].body
    assert resolve["dedup_key"] == trigger["dedup_key"]
    wait_for(lambda: [r for r in receiver.accepted("/hook") if r.body["status"] == "resolved"],
             10, "the resolved webhook")
    wait_for(lambda: any('"color": "good"' in json.dumps(r.body)
                         for r in receiver.accepted("/slack")), 10, "the resolved Slack message")
    triggers = [r for r in receiver.accepted("/v2/enqueue") if r.body["event_action"] == "trigger"]
    assert len(triggers) == 1  # resend-delay 1 s, repeat_interval 1 h: no duplicate page
    assert prom.query("ALERTS") == []
