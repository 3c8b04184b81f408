"""Notifications grouped per run for Slack and the webhook, as Alertmanager groups alerts.

Routing stores each step's transitions for a grouped destination as a *member* of its run's group
(the events themselves, rendered at send time), in the durable outbox like any notification, with
the run's group as its order key. A member is due after ``group_wait`` (its companions arrive
meanwhile), and once the group has sent, not before ``group_interval`` after the group's last
message, unless it says a critical alert fires (a new one, or a warning escalated): that goes after
the group wait, with the members queued before it, so a Slack-only team hears of an escalation in
seconds, after a restart too (the interval is kept in the outbox's file). When the oldest member of
a group is due, the deliverer claims every member the group holds (:meth:`Outbox.claim_group`) and
sends them as one message: a run's end on every role, or three alerts in the group wait, is one
message; an escalation or a resolve later is an update of the group (the webhook's ``update``; with
a Slack bot token a reply in the thread of the group's first message). Every member is acked,
retried or kept as failed with the message, so a group is as durable as a single notification:
nothing is sent before it is stored, and an undelivered group is retried and kept. What a group's
next message needs (when the group began and last sent, how many messages it sent, its Slack
thread's ts) is kept in the outbox's file as each message goes, so after a restart an update is
still an update, in the same thread.

PagerDuty is not grouped: one incident per alert, by its dedup key. The console is not either
(it is the local view, shown at once).
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict, defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from rlmon.service.alerting.alert_types import AlertEvent
from rlmon.service.alerting.notify.message import Notification
from rlmon.service.alerting.notify.outbox import GroupRow, Outbox
from rlmon.service.alerting.notify.render import (
    run_url,
    slack_body,
    summary_line,
    webhook_body,
)
from rlmon.service.config import GroupingConfig, Settings
from rlmon.service.wording import counted

__all__ = ["GROUPED", "Groups", "group_key", "is_member", "is_urgent", "member", "member_events"]

GROUPED: tuple[str, ...] = ("slack", "webhook")
_MEMBER = "rlmon_group_member"  # the key a member body carries (never sent as such)
_URGENT = "rlmon_group_urgent"  # a member's key: it says a critical alert fires (is_urgent)
_MAX_GROUPS = 10_000  # groups whose timing is remembered (the least recent leave)
_MAX_SLACK_BLOCKS = 48  # Slack refuses a message of more than 50 blocks


def group_key(run: str) -> str:
    """The order key of a run's group: its members are delivered in order, together."""
    return f"group:{run}"


def member(destination: str, key: str, events: Sequence[AlertEvent],
           created: float) -> Notification:
    """One step's transitions for a grouped destination, as a member of its run's group (the
    events as JSON text: a NaN value stays one, and the outbox's body stays strict JSON)."""
    urgent = any(e.state == "firing" and e.severity == "critical" for e in events)
    body = {_MEMBER: 1, _URGENT: int(urgent), "events": json.dumps([asdict(e) for e in events])}
    return Notification(destination, key, group_key(events[0].run), body, created)


def is_member(body: dict[str, Any]) -> bool:
    return bool(body.get(_MEMBER))


def is_urgent(body: dict[str, Any]) -> bool:
    """A member that says a critical alert fires (a new one or an escalation): it goes after the
    group wait, not the group interval, and the members queued before it go with it."""
    return is_member(body) and bool(body.get(_URGENT))


def member_events(body: dict[str, Any]) -> list[AlertEvent]:
    out = []
    for fields in json.loads(body["events"]):
        fields["samples"] = tuple(tuple(s) for s in fields.get("samples", ()))
        out.append(AlertEvent(**fields))
    return out


@dataclass(slots=True)
class _Group:
    first: float  # when its first message was rendered (its Slack thread's key)
    last: float  # when its latest message went
    sent: int  # messages sent
    thread: str | None = None  # the receiver's id of its thread (a Slack ts), once it has one


class Groups:
    """When each group's members are due, and what one group message says; with an ``outbox``,
    each group's state is kept in its file and read back by the next process."""

    def __init__(self, config: GroupingConfig, outbox: Outbox | None = None,
                 now: float | None = None) -> None:
        self.config = config
        self.outbox = outbox
        self._groups: OrderedDict[tuple[str, str], _Group] = OrderedDict()
        self._lock = threading.Lock()  # the intake thread and each destination's thread
        if outbox is not None:  # a restart: the groups that have not ended go on
            since = (time.time() if now is None else now) - config.group_ttl_seconds
            for row in outbox.groups(since)[-_MAX_GROUPS:]:
                self._groups[(row.destination, row.order_key)] = _Group(
                    row.first, row.last, row.sent, row.thread)

    def _live(self, destination: str, order_key: str, now: float) -> _Group | None:
        group = self._groups.get((destination, order_key))
        if group is not None and now - group.last > self.config.group_ttl_seconds:
            del self._groups[(destination, order_key)]
            return None
        return group

    def due(self, notification: Notification, now: float) -> float | None:
        """When a new member may go (None: not a member, due now)."""
        if not is_member(notification.body):
            return None
        with self._lock:
            group = self._live(notification.destination, notification.order_key, now)
            wait = now + self.config.group_wait_seconds
            if group is None or not group.sent or is_urgent(notification.body):
                return wait
            # an update waits the group wait too: a run's end on every role after a quiet
            # interval is still one message, not its first role's and then the rest
            return max(wait, group.last + self.config.group_interval_seconds)

    def sent(self, destination: str, order_key: str, now: float,
             thread: str | None = None) -> None:
        """A group message was accepted (``thread``: the thread it opened, a Slack ts)."""
        with self._lock:
            group = self._live(destination, order_key, now)
            if group is None:
                group = _Group(now, now, 0)
            group.last, group.sent = now, group.sent + 1
            if group.thread is None:
                group.thread = thread
            self._groups.pop((destination, order_key), None)
            self._groups[(destination, order_key)] = group
            while len(self._groups) > _MAX_GROUPS:
                del self._groups[next(iter(self._groups))]
            row = GroupRow(destination, order_key, group.first, group.last, group.sent,
                           group.thread)
        if self.outbox is not None:
            self.outbox.save_group(row, now - self.config.group_ttl_seconds)

    def body(self, destination: str, order_key: str, events: Sequence[AlertEvent],
             settings: Settings, state_dir: str | None, now: float) -> dict[str, Any]:
        """One message for a group's pending members (``events``, in order)."""
        with self._lock:
            group = self._live(destination, order_key, now)
            if group is None:  # its first message: the thread's key from now on
                group = self._groups[(destination, order_key)] = _Group(now, now, 0)
            update = group.sent > 0
            thread = f"{order_key}@{group.first:.6f}"
            thread_ts = group.thread
        if destination == "slack":
            body = group_slack_body(events, settings, state_dir, update, thread)
            if thread_ts is not None:
                body["thread_ts"] = thread_ts
            return body
        return group_webhook_body(events, settings, state_dir, update, order_key)


def _by_step(events: Sequence[AlertEvent]) -> list[list[AlertEvent]]:
    """The events by (role, attempt, step), in the order the steps came."""
    parts: dict[tuple[str, int, int], list[AlertEvent]] = defaultdict(list)
    for event in events:
        parts[(event.role, event.attempt, event.step)].append(event)
    return list(parts.values())


def group_slack_body(events: Sequence[AlertEvent], settings: Settings, state_dir: str | None,
                     update: bool, thread: str) -> dict[str, Any]:
    """A run's grouped Slack message: for one step, the message a step always had; for more, a
    header for the run and each step's sections under a line naming its role and step. The
    ``thread`` key is the notifier's (a bot posts replies of one group in one thread)."""
    parts = _by_step(events)
    first = events[0]
    username = settings.notifiers.slack.username
    page = settings.run_page()
    if len(parts) == 1:
        body = slack_body(parts[0], settings.dashboard_link(first.run, first.role), username,
                          state_dir, page)
    else:
        firing = [e for e in events if e.state == "firing"]
        counts = [f"{len(firing)} firing"] if firing else []
        if len(firing) < len(events):
            counts.append(f"{len(events) - len(firing)} resolved")
        worst = "critical" if any(e.severity == "critical" for e in firing) else "warning"
        icon = (":rotating_light:" if worst == "critical" else ":warning:") if firing else \
            ":white_check_mark:"
        roles = sorted({e.role for e in events})
        title = (f"{icon} rlmon: {', '.join(counts)} on {first.run} "
                 f"({counted(len(roles), 'role')})")
        blocks: list[dict[str, Any]] = [
            {"type": "header", "text": {"type": "plain_text", "text": title[:150],
                                        "emoji": True}}]
        for part in parts:
            head = part[0]
            sub = slack_body(part, settings.dashboard_link(head.run, head.role), username,
                             state_dir, page)
            blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": (
                f"*{_mrkdwn(head.role)}* · step {head.step}")}]})
            blocks.extend(sub["blocks"][1:-1])  # without its header and footer
        footer = f"run `{_mrkdwn(first.run)}` · roles {', '.join(roles)}"
        link = run_url(first.run, first.role, page)
        if link:
            footer += f" · <{link}|Open run>"
        if len(blocks) > _MAX_SLACK_BLOCKS:
            cut = len(blocks) - _MAX_SLACK_BLOCKS + 1
            blocks = blocks[:_MAX_SLACK_BLOCKS - 1]
            footer += f" · {cut} more blocks not shown (every alert is in the run page)"
        blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": footer}]})
        body = {"text": "; ".join(summary_line(e) for e in events)[:3000], "blocks": blocks,
                "username": username}
    if update:
        body["text"] = "Update: " + body["text"]
    body["thread"] = thread
    return body


def group_webhook_body(events: Sequence[AlertEvent], settings: Settings,
                       state_dir: str | None, update: bool, order_key: str) -> dict[str, Any]:
    """A run's grouped webhook body: the per-step body's fields, every alert of the group (each
    line names its role and step), ``group_key`` (the same for every message of the run's
    group) and ``update`` (false for the group's first message)."""
    first = events[0]
    parts = _by_step(events)
    body = webhook_body(parts[0], settings.dashboard_link(first.run, first.role), state_dir,
                        settings.run_page())
    for part in parts[1:]:
        body["alerts"].extend(webhook_body(part, None, state_dir, settings.run_page())["alerts"])
    body["roles"] = sorted({e.role for e in events})
    body["step"] = max(e.step for e in events)
    body["group_key"] = order_key
    body["update"] = update
    body["status"] = "firing" if any(e.state == "firing" for e in events) else "resolved"
    return body


def _mrkdwn(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
