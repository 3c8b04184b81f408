"""Notifications grouped per run (notify.grouping), as Alertmanager groups them: real webhook and
slack-sdk (bot token) clients against a loopback receiver, PagerDuty's real client beside them;
the group wait and interval on a simulated clock (``pump(now)``), and a live service whose run
ends on three roles at once."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from rlmon.service.alerting.alert_types import AlertEvent
from rlmon.service.alerting.notify.dispatcher import Dispatcher
from rlmon.service.alerting.notify.factory import build_notifiers
from rlmon.service.alerting.notify.outbox import Backoff, Outbox
from rlmon.service.config import Settings
from rlmon.service.liveness.run_state import LivenessView, RunState
from rlmon.service.service_core import ServiceCore
from tests.support.alerting_support import LoopbackTransport, Receiver
from tests.support.clock import FakeClock
from tests.support.polling import wait_for

RUN = "grpo-7b"



@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver().start()
    yield r
    r.stop()


def _settings(receiver: Receiver, defaults: bool = False, **grouping: Any) -> Settings:
    """Slack (a bot), the webhook and PagerDuty on ``receiver``; grouping with a wait of 10 s and
    an interval of 60 s (with ``defaults``: as a first-time user gets it, nothing set)."""
    wanted = {} if defaults else {"enabled": True, "group_wait_seconds": 10,
                                  "group_interval_seconds": 60, **grouping}
    return Settings.model_validate({
        "notifiers": {
            "grouping": wanted,
            "webhook": {"url": f"{receiver.url}/hook"},
            "slack": {"bot_token": "xoxb-test-token", "channel": "C0RLMON",
                      "api_url": f"{receiver.url}/api/", "min_interval_seconds": 0},
            "pagerduty": {"routing_key": "R" * 32, "min_interval_seconds": 0},
            "console": {"enabled": False},
        },
        "routing": {"critical": ["pagerduty", "slack", "webhook"],
                    "warning": ["slack", "webhook"]},
    })


def _dispatcher(settings: Settings, receiver: Receiver, clock: FakeClock, path: Path) -> Dispatcher:
    outbox = Outbox(path, clock=clock, backoff=Backoff(1.0, 1.0, 0.0))
    return Dispatcher(settings, outbox, build_notifiers(
        settings, transports={"pagerduty": LoopbackTransport(receiver.port)}), clock=clock)


def _slack_ok(receiver: Receiver, ts: str) -> None:
    receiver.script("/api/chat.postMessage", 200, {"Content-Type": "application/json"},
                    json.dumps({"ok": True, "channel": "C0RLMON", "ts": ts}))


def _event(role: str, step: int, alert: str = "RunDied", state: str = "firing",
           severity: str = "critical", run: str = RUN) -> AlertEvent:
    return AlertEvent(run, role, step, alert, severity, state, "", None)  # type: ignore[arg-type]


def _slack(receiver: Receiver) -> list[dict[str, Any]]:
    return [r.body for r in receiver.accepted("/api/chat.postMessage")]


def test_three_alerts_of_a_run_within_the_group_wait_are_one_message(
        receiver: Receiver, tmp_path: Path) -> None:
    clock = FakeClock(1_700_000_000.0)
    start = clock.now
    dispatcher = _dispatcher(_settings(receiver), receiver, clock, tmp_path / "outbox.sqlite")
    _slack_ok(receiver, "1700000000.000100")
    for i, role in enumerate(("actor", "rollout", "reward")):
        clock.now = start + i
        dispatcher.submit([_event(role, 10 + i)])
    clock.now = start + 9.9
    dispatcher.pump(clock.now)
    # PagerDuty is not grouped: one incident per alert, at once
    assert [r.body["dedup_key"] for r in receiver.accepted("/v2/enqueue")] == [
        f"{RUN}/{role}/RunDied" for role in ("actor", "rollout", "reward")]
    assert not receiver.accepted("/hook") and not _slack(receiver)  # still in the group wait
    clock.now = start + 10.0
    dispatcher.pump(clock.now)
    hooks = [r.body for r in receiver.accepted("/hook")]
    assert len(hooks) == 1
    body = hooks[0]
    assert [(a["role"], a["step"], a["alert"]) for a in body["alerts"]] == [
        ("actor", 10, "RunDied"), ("rollout", 11, "RunDied"), ("reward", 12, "RunDied")]
    assert body["group_key"] == f"group:{RUN}" and body["update"] is False
    assert body["roles"] == ["actor", "reward", "rollout"] and body["status"] == "firing"
    slack = _slack(receiver)
    assert len(slack) == 1 and "thread_ts" not in slack[0] and slack[0]["channel"] == "C0RLMON"
    assert "3 firing on grpo-7b (3 roles)" in slack[0]["blocks"][0]["text"]["text"]
    assert dispatcher.outbox.pending() == 0
    counts = dispatcher.stats().outcomes
    assert (counts[("webhook", "sent")], counts[("slack", "sent")]) == (1, 1)

    # a resolve and a new warning later: one update of the group, after the group interval,
    # in the Slack thread of the group's first message
    clock.now = start + 30
    dispatcher.submit([_event("actor", 13, state="resolved")])
    clock.now = start + 31
    dispatcher.submit([_event("rollout", 14, alert="KLDivergence", severity="warning")])
    _slack_ok(receiver, "1700000070.000200")
    clock.now = start + 69.9
    dispatcher.pump(clock.now)
    assert len(receiver.accepted("/hook")) == 1
    clock.now = start + 70.0
    dispatcher.pump(clock.now)
    hooks = [r.body for r in receiver.accepted("/hook")]
    assert len(hooks) == 2
    update = hooks[1]
    assert update["update"] is True and update["group_key"] == f"group:{RUN}"
    assert [(a["alert"], a["state"]) for a in update["alerts"]] == [
        ("RunDied", "resolved"), ("KLDivergence", "firing")]
    slack = _slack(receiver)
    assert len(slack) == 2 and slack[1]["thread_ts"] == "1700000000.000100"
    assert slack[1]["text"].startswith("Update: ")
    # PagerDuty's resolve went at once, one per alert (the warning pages no one)
    assert [r.body["event_action"] for r in receiver.accepted("/v2/enqueue")] == [
        "trigger", "trigger", "trigger", "resolve"]


def test_an_escalation_goes_after_the_group_wait_not_the_interval_after_a_restart_too(
        receiver: Receiver, tmp_path: Path) -> None:
    """A warning escalated to critical (or a new critical) is an update of the group that goes
    after the group wait, taking the members queued before it along, not after the group
    interval: also from a restarted service, which reads the group's last message back."""
    clock = FakeClock(1_700_000_000.0)
    start = clock.now
    settings = _settings(receiver)
    settings.routing.critical = ["slack", "webhook"]
    path = tmp_path / "outbox.sqlite"
    dispatcher = _dispatcher(settings, receiver, clock, path)
    _slack_ok(receiver, "1700000010.000100")
    dispatcher.submit([_event("actor", 40, alert="KLDivergence", severity="warning")])
    clock.now = start + 10
    dispatcher.pump(clock.now)
    assert len(receiver.accepted("/hook")) == 1
    # a resolve of something else: an ordinary update, held for the group interval
    clock.now = start + 12
    dispatcher.submit([_event("actor", 41, alert="EntropySliding", severity="warning",
                              state="resolved")])
    dispatcher.outbox.close()
    again = _dispatcher(settings, receiver, clock, path)  # a restart
    clock.now = start + 20
    again.submit([replace(_event("actor", 45, alert="KLDivergence"), escalated_from="warning")])
    _slack_ok(receiver, "1700000030.000200")
    clock.now = start + 29.9
    again.pump(clock.now)
    assert len(receiver.accepted("/hook")) == 1  # still in the group wait
    clock.now = start + 30
    again.pump(clock.now)  # 30 s before the group interval would let an update go
    hooks = [r.body for r in receiver.accepted("/hook")]
    assert len(hooks) == 2 and hooks[1]["update"] is True
    assert [(a["alert"], a["state"], a["severity"]) for a in hooks[1]["alerts"]] == [
        ("EntropySliding", "resolved", "warning"), ("KLDivergence", "firing", "critical")]
    slack = _slack(receiver)
    assert len(slack) == 2 and slack[1]["thread_ts"] == "1700000010.000100"
    assert again.outbox.pending() == 0
    # a warning after it waits the interval again, from the escalation's message
    clock.now = start + 35
    again.submit([_event("rollout", 46, alert="EntropySliding", severity="warning")])
    clock.now = start + 89.9
    again.pump(clock.now)
    assert len(receiver.accepted("/hook")) == 2
    clock.now = start + 90
    again.pump(clock.now)
    assert len(receiver.accepted("/hook")) == 3


def test_runs_are_grouped_apart_and_one_step_keeps_the_steps_message(
        receiver: Receiver, tmp_path: Path) -> None:
    clock = FakeClock(1_700_000_000.0)
    dispatcher = _dispatcher(_settings(receiver, group_wait_seconds=0), receiver, clock,
                             tmp_path / "outbox.sqlite")
    _slack_ok(receiver, "1.1")
    _slack_ok(receiver, "2.2")
    dispatcher.submit([_event("actor", 3, run="a"), _event("actor", 3, alert="X", run="a")])
    dispatcher.submit([_event("actor", 5, run="b")])
    dispatcher.pump(clock.now)
    hooks = sorted((r.body for r in receiver.accepted("/hook")), key=lambda b: b["run"])
    assert [(b["run"], len(b["alerts"]), b["role"], b["step"]) for b in hooks] == [
        ("a", 2, "actor", 3), ("b", 1, "actor", 5)]
    # one step's alerts: the message a step has always had (its header names role and step)
    assert all("/ actor, step" in s["blocks"][0]["text"]["text"] for s in _slack(receiver))


def test_an_undelivered_group_is_retried_kept_and_sent_whole_after_a_restart(
        receiver: Receiver, tmp_path: Path) -> None:
    clock = FakeClock(1_700_000_000.0)
    start = clock.now
    settings = _settings(receiver)
    settings.routing.critical = ["webhook"]
    path = tmp_path / "outbox.sqlite"
    dispatcher = _dispatcher(settings, receiver, clock, path)
    for role in ("actor", "rollout", "reward"):
        dispatcher.submit([_event(role, 1)])
    receiver.script("/hook", 503)
    clock.now = start + 10
    dispatcher.pump(clock.now)
    assert len(receiver.tried("/hook")) == 1 and not receiver.accepted("/hook")
    assert dispatcher.outbox.pending() == 3  # every member kept
    dispatcher.outbox.close()
    # a restart: a new dispatcher on the same outbox file
    again = _dispatcher(settings, receiver, clock, path)
    clock.now = start + 12
    again.pump(clock.now)
    hooks = [r.body for r in receiver.accepted("/hook")]
    assert len(hooks) == 1 and len(hooks[0]["alerts"]) == 3
    assert again.outbox.pending() == 0 and again.outbox.counters().sent == 3


def test_a_runs_end_on_every_role_is_one_message_from_the_live_service(
        receiver: Receiver, tmp_path: Path) -> None:
    settings = _settings(receiver, group_wait_seconds=1.0, group_interval_seconds=1.0)
    settings.routing.critical = ["slack", "webhook"]
    _slack_ok(receiver, "1700000000.000300")
    _slack_ok(receiver, "1700000000.000400")
    core = ServiceCore(settings, state_dir=tmp_path).start()
    try:
        now = time.time()
        roles = ("actor", "rollout", "reward")
        for role in roles:  # each role's own view: the aggregator's timer sees them apart
            core.liveness([LivenessView(RUN, role, RunState.DEAD, now - 60, now, 9, now - 60,
                                        now - 60, 1.0, 30.0, 2, heartbeats=True)])
        wait_for(lambda: receiver.accepted("/hook") and _slack(receiver), 30,
                 "the grouped messages")
        wait_for(lambda: core.dispatcher.outbox.pending() == 0, 30, "nothing left to send")
        hooks = [r.body for r in receiver.accepted("/hook")]
        assert len(hooks) == 1 and len(_slack(receiver)) == 1
        assert sorted(a["role"] for a in hooks[0]["alerts"]) == sorted(roles)
        assert {a["alert"] for a in hooks[0]["alerts"]} == {"RunDied"}
        # the actor comes back: the resolve is an update of the group, in the Slack thread
        later = time.time()
        core.liveness([LivenessView(RUN, "actor", RunState.RUNNING, later, later, 10, later,
                                    later, 1.0, 30.0, 2, heartbeats=True)])
        wait_for(lambda: len(receiver.accepted("/hook")) == 2 and len(_slack(receiver)) == 2,
                 30, "the group's update")
        update = receiver.accepted("/hook")[1].body
        assert update["update"] is True and [(a["role"], a["state"]) for a in
                                             update["alerts"]] == [("actor", "resolved")]
        assert _slack(receiver)[1]["thread_ts"] == "1700000000.000300"
    finally:
        core.close(5.0)


def test_a_large_group_stays_within_slacks_block_limit(receiver: Receiver) -> None:
    from rlmon.service.alerting.notify.grouping import group_slack_body

    events = [_event("actor", step, alert=f"Alert{step}") for step in range(40)]
    body = group_slack_body(events, _settings(receiver), None, False, "group:x@1")
    assert len(body["blocks"]) <= 50
    assert "more blocks not shown" in body["blocks"][-1]["elements"][0]["text"]
    assert body["text"].count("[CRITICAL]") == 40  # the fallback text names every alert


def test_by_default_the_demos_end_on_its_three_roles_is_one_message_and_pages_at_once(
        receiver: Receiver, tmp_path: Path) -> None:
    """The demo's run (the bundled example: its alerts on their steps, 10 s apart) with nothing
    configured about grouping, then its end on every role within a second, after a quiet spell:
    Slack and the webhook get the end as one message, a few seconds after it; PagerDuty gets one
    incident per role at once."""
    from importlib import resources

    from rlmon.service.replay import replay

    settings = _settings(receiver, defaults=True)
    grouping = settings.notifiers.grouping
    assert grouping.enabled and grouping.group_wait_seconds <= 5  # a page in seconds
    wait = grouping.group_wait_seconds
    with (resources.files("rlmon") / "data" / "example_run.jsonl").open("rb") as handle:
        run = replay(handle)
    demo = run.alerts[0].run
    clock = FakeClock(1_700_000_000.0)
    start = clock.now
    dispatcher = _dispatcher(settings, receiver, clock, tmp_path / "outbox.sqlite")
    for i in range(8):
        _slack_ok(receiver, f"1700000000.00010{i}")
    by_step: dict[int, list[AlertEvent]] = {}
    for event in run.alerts:
        by_step.setdefault(event.step, []).append(event)
    for tick in range(0, 10 * 30 + 1):  # the run, pumped every second of its 300 s
        clock.now = start + tick
        if tick % 10 == 0 and tick // 10 in by_step:
            dispatcher.submit(by_step[tick // 10])
        dispatcher.pump(clock.now)
    during = len(receiver.accepted("/hook"))
    assert during >= 1 and len(_slack(receiver)) == during
    assert dispatcher.outbox.pending() == 0
    pages = len(receiver.accepted("/v2/enqueue"))
    # the end, on every role within a second, ten minutes after the run's last message
    end = start + 900
    for offset, role in zip((0.0, 0.4, 0.9), ("actor", "rollout", "reward"), strict=True):
        clock.now = end + offset
        dispatcher.submit([_event(role, 29, run=demo)])
        dispatcher.pump(clock.now)
    assert len(receiver.accepted("/v2/enqueue")) == pages + 3  # not grouped, not delayed
    clock.now = end + wait - 0.01
    dispatcher.pump(clock.now)
    assert len(receiver.accepted("/hook")) == during  # the group wait: the rest may come
    clock.now = end + wait
    dispatcher.pump(clock.now)
    hooks = [r.body for r in receiver.accepted("/hook")]
    assert len(hooks) == during + 1
    assert sorted(a["role"] for a in hooks[-1]["alerts"]) == ["actor", "reward", "rollout"]
    assert hooks[-1]["update"] is True and hooks[-1]["group_key"] == f"group:{demo}"
    slack = _slack(receiver)
    assert len(slack) == during + 1
    assert "3 firing on grpo-demo-0 (3 roles)" in slack[-1]["blocks"][0]["text"]["text"]
    assert slack[-1]["thread_ts"] == "1700000000.000100"  # a reply in the run's thread
    assert dispatcher.outbox.pending() == 0


def test_by_default_a_runs_end_is_one_message_from_the_live_service(
        receiver: Receiver, tmp_path: Path) -> None:
    """A live service with the default grouping (a first-time user's): a run whose three roles
    die at once is one Slack message and one webhook post."""
    settings = _settings(receiver, defaults=True)
    settings.routing.critical = ["slack", "webhook"]
    _slack_ok(receiver, "1700000000.000500")
    core = ServiceCore(settings, state_dir=tmp_path).start()
    try:
        now = time.time()
        roles = ("actor", "rollout", "reward")
        for role in roles:
            core.liveness([LivenessView(RUN, role, RunState.DEAD, now - 60, now, 9, now - 60,
                                        now - 60, 1.0, 30.0, 2, heartbeats=True)])
        wait_for(lambda: receiver.accepted("/hook") and _slack(receiver), 30,
                 "the grouped messages")
        wait_for(lambda: core.dispatcher.outbox.pending() == 0, 30, "nothing left to send")
        hooks = [r.body for r in receiver.accepted("/hook")]
        assert len(hooks) == 1 and len(_slack(receiver)) == 1
        assert sorted(a["role"] for a in hooks[0]["alerts"]) == sorted(roles)
    finally:
        core.close(5.0)


def test_a_groups_updates_after_a_service_restart_reply_in_its_slack_thread(
        receiver: Receiver, tmp_path: Path) -> None:
    """A live service on a state directory sends a run's grouped message (a Slack bot: it opens
    the run's thread), is closed and started again on the same directory; the run's resolve
    after the restart is an update of the group: in the same Slack thread (slack-sdk's real
    client against the loopback receiver), ``update`` true on the webhook."""
    settings = _settings(receiver, group_wait_seconds=0.5, group_interval_seconds=0.5)
    settings.routing.critical = ["slack", "webhook"]
    _slack_ok(receiver, "1700000000.000700")  # the group's first message: its thread
    _slack_ok(receiver, "1700000000.000800")
    _slack_ok(receiver, "1700000000.000900")
    core = ServiceCore(settings, state_dir=tmp_path).start()
    try:
        now = time.time()
        for role in ("actor", "rollout"):
            core.liveness([LivenessView(RUN, role, RunState.DEAD, now - 60, now, 9, now - 60,
                                        now - 60, 1.0, 30.0, 2, heartbeats=True)])
        wait_for(lambda: receiver.accepted("/hook") and _slack(receiver), 30,
                 "the grouped messages")
        wait_for(lambda: core.dispatcher.outbox.pending() == 0, 30, "nothing left to send")
    finally:
        core.close(5.0)
    assert len(_slack(receiver)) == 1 and "thread_ts" not in _slack(receiver)[0]
    again = ServiceCore(settings, state_dir=tmp_path).start()
    try:
        later = time.time()
        again.liveness([LivenessView(RUN, "actor", RunState.RUNNING, later, later, 10, later,
                                     later, 1.0, 30.0, 2, heartbeats=True)])
        wait_for(lambda: len(receiver.accepted("/hook")) == 2 and len(_slack(receiver)) == 2,
                 30, "the group's update after the restart")
        update = receiver.accepted("/hook")[1].body
        assert update["update"] is True and [(a["role"], a["state"]) for a in
                                             update["alerts"]] == [("actor", "resolved")]
        reply = _slack(receiver)[1]
        assert reply["thread_ts"] == "1700000000.000700"  # the run's thread, kept
        assert reply["text"].startswith("Update: ")
    finally:
        again.close(5.0)
    # a second restart goes on in the same thread: the thread's ts stays the first message's
    third = ServiceCore(settings, state_dir=tmp_path).start()
    try:
        last = time.time()
        third.liveness([LivenessView(RUN, "rollout", RunState.RUNNING, last, last, 10, last,
                                     last, 1.0, 30.0, 2, heartbeats=True)])
        wait_for(lambda: len(_slack(receiver)) == 3, 30, "the next update")
        assert _slack(receiver)[2]["thread_ts"] == "1700000000.000700"
    finally:
        third.close(5.0)


def test_a_group_that_ended_opens_a_new_thread_after_a_restart(
        receiver: Receiver, tmp_path: Path) -> None:
    """The group's TTL holds across a restart too: a run quiet for longer than it starts a new
    group (a first message, a new thread), read from the same outbox file."""
    clock = FakeClock(1_700_000_000.0)
    start = clock.now
    settings = _settings(receiver, group_wait_seconds=0, group_ttl_seconds=3600)
    settings.routing.critical = ["slack"]
    path = tmp_path / "outbox.sqlite"
    dispatcher = _dispatcher(settings, receiver, clock, path)
    _slack_ok(receiver, "1.1")
    _slack_ok(receiver, "1.2")
    dispatcher.submit([_event("actor", 1)])
    dispatcher.submit([_event("actor", 1, run="other")])
    dispatcher.pump(clock.now)
    assert len(_slack(receiver)) == 2
    assert {g.order_key for g in dispatcher.outbox.groups(since=0)} == {
        f"group:{RUN}", "group:other"}
    dispatcher.outbox.close()
    clock.now = start + 3601  # longer than the group's TTL
    again = _dispatcher(settings, receiver, clock, path)
    _slack_ok(receiver, "2.2")
    again.submit([_event("actor", 2, state="resolved")])
    again.pump(clock.now)
    slack = _slack(receiver)
    assert len(slack) == 3 and "thread_ts" not in slack[2]
    assert not slack[2]["text"].startswith("Update: ")
    clock.now += 120  # its update replies in the new thread
    _slack_ok(receiver, "3.3")
    again.submit([_event("actor", 3)])
    again.pump(clock.now)
    assert _slack(receiver)[3]["thread_ts"] == "2.2"
    # the ended groups left the file: the other run's with them
    assert [(g.order_key, g.thread, g.sent) for g in again.outbox.groups(since=0)] == [
        (f"group:{RUN}", "2.2", 2)]
    again.outbox.close()
