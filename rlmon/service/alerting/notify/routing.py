"""Routing: which destinations get an alert, and how alerts become notifications.

Severity routes come from config (critical: PagerDuty and Slack; warning: Slack by default), the
first matching per-run override wins, and silences mute matching alerts. When none of an alert's
routed receivers is configured, the console gets it (unless disabled in config). Chat-like destinations
(Slack, webhook, console) get one message per (run, role, step) holding every alert of that step;
PagerDuty gets one event per alert, so its dedup_key opens and closes one incident.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from rlmon.service.alerting.alert_types import AlertEvent
from rlmon.service.alerting.notify.grouping import GROUPED, member
from rlmon.service.alerting.notify.message import Notification
from rlmon.service.alerting.notify.render import pagerduty_body, slack_body, webhook_body
from rlmon.service.config import Settings

__all__ = ["Routed", "route"]


@dataclass(slots=True)
class Routed:
    notifications: list[Notification] = field(default_factory=list)
    silenced: int = 0
    held: int = 0  # over the engine's per-hour bound for their alert (stored, not sent)
    unroutable: dict[str, int] = field(default_factory=dict)  # destination not configured


def _chat_key(destination: str, events: Sequence[AlertEvent]) -> str:
    first = events[0]
    alerts = ",".join(f"{e.alert}={e.state}" for e in sorted(events, key=lambda e: e.alert))
    return f"{destination}:{first.run}/{first.role}@{_at(first)}:{alerts}"


def _at(event: AlertEvent) -> str:
    """Where an event happened, for outbox keys: a rerun's step 4 is not the first run's."""
    return f"{event.step}" if not event.attempt else f"{event.step}#{event.attempt}"


def route(
    events: Sequence[AlertEvent], settings: Settings, available: Collection[str],
    created: float = 0.0, state_dir: str | None = None,
) -> Routed:
    """Turn alert events into notifications for the destinations in ``available``
    (``state_dir``: the service's, for the `rlmon samples` command they quote)."""
    out = Routed()
    groups: dict[tuple[str, str, str, int], list[AlertEvent]] = defaultdict(list)
    for event in events:
        if not event.notify:
            out.held += 1
            continue
        silenced = settings.silenced(event.run, event.role, event.alert)
        wanted = settings.routing.destinations(event.run, event.severity)
        if "console" in available and not any(d in available for d in wanted):
            # none of the routed receivers is configured (the embedded default): the console
            # of the process that started the service shows the alert instead of nobody
            wanted = ["console"]
        for dest in wanted:
            # a silence mutes triggers; a PagerDuty resolve still goes out so no incident dangles
            if silenced and not (dest == "pagerduty" and event.state == "resolved"):
                continue
            if dest not in available:
                out.unroutable[dest] = out.unroutable.get(dest, 0) + 1
                continue
            if dest == "pagerduty":
                out.notifications.append(_pagerduty(event, settings, created, state_dir))
            else:
                groups[(dest, event.run, event.role, event.step)].append(event)
        if silenced:
            out.silenced += 1
    grouped = GROUPED if settings.notifiers.grouping.enabled else ()
    for (dest, run, role, _step), group in groups.items():
        if dest in grouped:  # rendered when its run's group goes (notify.grouping)
            out.notifications.append(member(dest, _chat_key(dest, group), group, created))
            continue
        dashboard = settings.dashboard_link(run, role)
        page = settings.run_page()  # links to the alert's page on rlmon's run page
        body = (
            slack_body(group, dashboard, settings.notifiers.slack.username, state_dir, page)
            if dest == "slack" else webhook_body(group, dashboard, state_dir, page)
        )
        out.notifications.append(
            Notification(dest, _chat_key(dest, group), f"{run}/{role}", body, created)
        )
    return out


def _pagerduty(event: AlertEvent, settings: Settings, created: float,
               state_dir: str | None) -> Notification:
    pd = settings.notifiers.pagerduty
    body = pagerduty_body(event, dict(pd.severity_map), pd.group,
                          settings.dashboard_link(event.run, event.role), state_dir,
                          settings.run_page())
    key = f"pagerduty:{event.dedup_key}@{_at(event)}:{event.state}"
    return Notification("pagerduty", key, event.dedup_key, body, created)
