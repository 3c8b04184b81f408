"""Our own engine delivering through the real slack-sdk and pagerduty clients to a loopback receiver.

PagerDuty: the ``pagerduty`` client refuses plain-http base URLs, so these tests use its transport
injection: :class:`alerting_support.LoopbackTransport` (an httpx2 transport) sends the client's real
requests to the loopback receiver over plain HTTP. Slack goes through ``WebhookClient`` to a
``http://127.0.0.1`` webhook URL; the generic webhook through urllib.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlmon.service.alerting.engine import AlertEngine, AlertEvent
from rlmon.service.alerting.notify import Dispatcher, build_dispatcher, build_notifiers, open_outbox
from rlmon.service.alerting.rules import default_rules
from rlmon.service.config import Settings
from tests.support.alerting_support import LoopbackTransport, Receiver, wait_for
from tests.support.clock import FakeClock
from tests.support.network import free_port
from tests.support.paths import REPO
from tests.support.records import step_record

KEY = "0123456789abcdef0123456789abcdef"
ROOT = REPO

pytestmark = pytest.mark.slow


def run_events() -> list[list[AlertEvent]]:
    """Three steps of one run: IS ratio and logprob diverge at step 1, recover at step 2.

    The pack runs without hysteresis (resolve after one good step), so step 2 resolves what step 1
    fired: these tests are about delivery, not about when an alert resolves (issue 30). The
    logprob difference (1.5) is past LogprobMismatch's critical bound (0.3) for one step only:
    that warning stays a warning (one step past a critical level is a spike), so it goes to Slack
    alone; LogprobDivergence (past 1) pages."""
    rules = [r.model_copy(update={"resolve_after": 1}) for r in default_rules()]
    engine = AlertEngine(rules)
    values = [(1.0, 0.01), (3.0, 1.5), (1.0, 0.02)]
    out = []
    for step, (ratio, diff) in enumerate(values):
        record = step_record(run="grpo-7b", step=step, ranks_expected=4,
                             metrics={"actor/is_ratio": ratio, "actor/logp_diff": diff})
        out.append(engine.evaluate(record))
    return out


def make_settings(receiver_port: int, outbox: Path, slack_interval: float = 0.0) -> Settings:
    os.environ["RLMON_SLACK_WEBHOOK_URL"] = f"http://127.0.0.1:{receiver_port}/slack/T0/B0/sEcReT"
    os.environ["RLMON_PAGERDUTY_ROUTING_KEY"] = KEY
    # each step's message on its own: these tests are about delivery (exactly once, retries,
    # rate limits); a run's messages grouped are test_notify_grouping's
    return Settings.model_validate({
        "notifiers": {"grouping": {"enabled": False},
                      "slack": {"min_interval_seconds": slack_interval},
                      "pagerduty": {"min_interval_seconds": 0.0},
                      "webhook": {"url": f"http://127.0.0.1:{receiver_port}/hook"},
                      "console": {"enabled": False}},
        "routing": {"critical": ["pagerduty", "slack", "webhook"], "warning": ["slack"]},
        "outbox": {"path": str(outbox), "backoff_initial_seconds": 0.05,
                   "backoff_max_seconds": 0.3},
    })


@pytest.fixture(autouse=True)
def _clean_env() -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in ("RLMON_SLACK_WEBHOOK_URL",
                                            "RLMON_PAGERDUTY_ROUTING_KEY")}
    yield
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def dispatcher_for(settings: Settings, port: int) -> Dispatcher:
    return build_dispatcher(settings, open_outbox(settings),
                            transports={"pagerduty": LoopbackTransport(port)})


def pd_actions(receiver: Receiver) -> list[tuple[str, str]]:
    return [(r.body["event_action"], r.body["dedup_key"]) for r in receiver.accepted("/v2/enqueue")]


EXPECTED_PD = [
    ("trigger", "grpo-7b/actor/ISRatioDivergence"),
    ("trigger", "grpo-7b/actor/LogprobDivergence"),
    ("resolve", "grpo-7b/actor/ISRatioDivergence"),
    ("resolve", "grpo-7b/actor/LogprobDivergence"),
]


DELIVERIES = len(EXPECTED_PD) + 2 + 2  # PagerDuty's, Slack's and the webhook's


def assert_exact(receiver: Receiver) -> None:
    """Every notification exactly once: 4 PagerDuty events, 2 Slack messages, 2 webhook posts."""
    assert sorted(pd_actions(receiver)) == sorted(EXPECTED_PD)
    for key in {k for _, k in EXPECTED_PD}:  # per incident, the trigger precedes the resolve
        assert [a for a, k in pd_actions(receiver) if k == key] == ["trigger", "resolve"]
    slack = [json.dumps(r.body, sort_keys=True) for r in receiver.accepted("/slack")]
    assert len(slack) == 2
    assert len(set(slack)) == 2
    assert "firing" in slack[0]
    assert "resolved" in slack[1]
    assert len(receiver.accepted("/hook")) == 2
    for r in receiver.accepted("/v2/enqueue"):
        assert r.body["routing_key"] == KEY  # added by the client at send time


def test_live_delivery_is_complete(tmp_path: Path) -> None:
    """The delivery threads deliver everything exactly once and time each delivery (how long one
    takes from the step's finalization is a budget, measured by bench/bench_alert_latency.py)."""
    receiver = Receiver().start()
    try:
        settings = make_settings(receiver.port, tmp_path / "o.sqlite")
        dispatcher = dispatcher_for(settings, receiver.port)
        dispatcher.start()
        for events in run_events():
            dispatcher.submit(events, finalized_at=time.time())
        # the latency is recorded after the ack, the last thing a delivery does
        wait_for(lambda: len(dispatcher.latencies) >= DELIVERIES, 60, "every acknowledged delivery")
        dispatcher.stop()
        assert_exact(receiver)
        assert len(dispatcher.latencies) == DELIVERIES  # one per delivery
        stats = dispatcher.stats()
        assert stats.outcomes[("pagerduty", "sent")] == len(EXPECTED_PD)
        assert sum(stats.pending.values()) == 0
    finally:
        receiver.stop()


def test_429_retry_after_is_honoured(tmp_path: Path) -> None:
    receiver = Receiver().start()
    receiver.script("/slack", 429, {"Retry-After": "1"}, "rate_limited")
    receiver.script("/v2/enqueue", 429, {"Retry-After": "1"},
                    '{"status":"throttle event","message":"Requests for this service are '
                    'arriving too quickly."}')
    try:
        settings = make_settings(receiver.port, tmp_path / "o.sqlite")
        dispatcher = dispatcher_for(settings, receiver.port)
        for events in run_events():
            dispatcher.submit(events)
        dispatcher.start()
        wait_for(lambda: len(receiver.requests) == DELIVERIES, 60, "every delivery after the 429s")
        dispatcher.stop()
        assert_exact(receiver)
        for prefix in ("/slack", "/v2/enqueue"):
            tried = receiver.tried(prefix)
            assert tried[0].status == 429
            assert tried[1].at - tried[0].at >= 0.95, f"{prefix}: Retry-After not honoured"
        assert dispatcher.stats().outcomes[("slack", "retried")] == 1
    finally:
        receiver.stop()


def test_receiver_down_then_back(tmp_path: Path) -> None:
    port = free_port()
    receiver = Receiver(port)  # not started: connection refused
    settings = make_settings(port, tmp_path / "o.sqlite")
    dispatcher = dispatcher_for(settings, port)
    for events in run_events():
        dispatcher.submit(events)
    dispatcher.start()
    try:
        wait_for(lambda: dispatcher.outbox.counters().retried >= len(EXPECTED_PD), 60,
                 "failed attempts")
        assert dispatcher.outbox.pending() == DELIVERIES
        receiver.start()
        wait_for(lambda: dispatcher.outbox.pending() == 0, 60, "the outbox to drain")
        dispatcher.stop()
        assert_exact(receiver)
        assert dispatcher.outbox.counters().sent == DELIVERIES
    finally:
        dispatcher.stop()
        receiver.stop()


def test_ten_minutes_down_loses_nothing(tmp_path: Path) -> None:
    """Simulated clock for the outage (real receiver, real clients): backoff is capped, and the
    first attempt after the receiver returns delivers everything."""
    clock = FakeClock(1_000.0)
    port = free_port()
    os.environ["RLMON_SLACK_WEBHOOK_URL"] = f"http://127.0.0.1:{port}/slack/T0/B0/sEcReT"
    settings = Settings.model_validate({
        "notifiers": {"grouping": {"enabled": False}, "slack": {"min_interval_seconds": 0.0},
                      "console": {"enabled": False}},
        "routing": {"critical": ["slack"], "warning": ["slack"]},
        "outbox": {"backoff_initial_seconds": 1, "backoff_max_seconds": 60},
    })
    from rlmon.service.alerting.notify.outbox import Backoff, Outbox

    box = Outbox(tmp_path / "o.sqlite", backoff=Backoff(1, 60, 0.2), clock=clock)
    dispatcher = Dispatcher(settings, box, build_notifiers(settings, ["slack"]),
                            clock=clock)
    for events in run_events():
        dispatcher.submit(events)
    attempts = 0
    while clock.now < 1_600.0:  # ten minutes of outage
        attempts += dispatcher.pump()
        clock.advance(5.0)
    assert box.pending() == 2
    assert box.counters().failed == 0
    assert 12 <= attempts <= 40  # backed off to about once a minute, not hammering
    receiver = Receiver(port).start()
    try:
        clock.advance(60.0 * 1.2 + 1.0)  # the capped backoff plus its largest jitter: every row due
        dispatcher.pump()
        assert box.pending() == 0
        assert len(receiver.accepted("/slack")) == 2
    finally:
        receiver.stop()


RESTART_CHILD = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    from tests.service.alerting.test_notify_delivery import make_settings, run_events, dispatcher_for
    from pathlib import Path
    settings = make_settings({port}, Path({outbox!r}))
    dispatcher = dispatcher_for(settings, {port})
    for events in run_events():
        dispatcher.submit(events)
    dispatcher.pump()  # the receiver is down: every head row fails and is rescheduled
    print(dispatcher.outbox.counters().pending, dispatcher.outbox.counters().retried)
""")


def test_restart_with_pending_notifications(tmp_path: Path) -> None:
    port = free_port()
    outbox = tmp_path / "o.sqlite"
    script = RESTART_CHILD.format(tests=str(REPO), port=port, outbox=str(outbox))
    child = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                           timeout=60, cwd=ROOT, check=False)
    assert child.returncode == 0, child.stderr
    pending, retried = map(int, child.stdout.split())
    assert pending == DELIVERIES
    assert retried >= 3
    receiver = Receiver(port).start()
    try:
        settings = make_settings(port, outbox)
        dispatcher = dispatcher_for(settings, port)  # a new process's view of the same file
        for events in run_events():  # the restarted engine re-submits: deduplicated
            assert dispatcher.submit(events) == 0
        assert dispatcher.drain(60)
        assert_exact(receiver)
        assert Counter(r.path.split("/")[1] for r in receiver.requests) == {
            "v2": len(EXPECTED_PD), "slack": 2, "hook": 2}
    finally:
        receiver.stop()


def test_alerts_routed_to_an_unconfigured_destination_are_counted_exported_and_said_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Critical alerts go to PagerDuty and Slack; only Slack is configured. What PagerDuty would
    have had is counted as the outcome `unroutable`, served in rlmon_notifications_total, and
    said once in the log however many alerts follow."""
    from prometheus_client import generate_latest

    from rlmon.service.export.exporter import MetricsState
    from rlmon.service.export.http import build_registry

    settings = Settings.model_validate({
        "notifiers": {"slack": {"webhook_url": f"http://127.0.0.1:{free_port()}/slack"},
                      "console": {"enabled": False}},
        "routing": {"critical": ["pagerduty", "slack"]},
        "outbox": {"path": str(tmp_path / "o.sqlite")},
    })
    dispatcher = build_dispatcher(settings, open_outbox(settings))
    with caplog.at_level("WARNING"):
        for step in range(3):
            dispatcher.submit([AlertEvent("grpo", "actor", step, "NonFiniteMetric", "critical",
                                          "firing", "actor/loss", float("nan"))], wake=False)
    assert dispatcher.stats().outcomes[("pagerduty", "unroutable")] == 3
    said = [r.getMessage() for r in caplog.records if "not configured" in r.getMessage()]
    assert said == ["alerts routed to pagerduty, which is not configured: not sent there "
                    "(counted as outcome 'unroutable')"]
    state = MetricsState()
    state.dispatch = dispatcher.stats  # as the service wires it
    scrape = generate_latest(build_registry(state, process=False)).decode()
    assert ('rlmon_notifications_total{destination="pagerduty",outcome="unroutable"} 3.0'
            in scrape)
