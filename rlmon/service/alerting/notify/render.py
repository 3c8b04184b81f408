"""Render alert events into destination bodies (Slack Block Kit, PagerDuty v2, webhook JSON).

Pure functions of events and settings: what is rendered is what the outbox stores, so a body must
be complete without any credential.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

from rlmon.service.alerting.engine import AlertEvent
from rlmon.service.alerting.notify.slack_text import code, link, own_words
from rlmon.service.alerting.notify.slack_text import mrkdwn as _mrkdwn
from rlmon.service.metrics import remedies
from rlmon.service.storage.stored_samples import command_for, items_to_json
from rlmon.service.wording import format_value

__all__ = ["alert_url", "cost_json", "pagerduty_body", "run_url", "samples_json",
           "slack_body", "state_label", "summary_line", "transition_label", "webhook_body",
           "what_to_change"]

_EMOJI = {("critical", "firing"): ":rotating_light:", ("warning", "firing"): ":warning:"}


def summary_line(event: AlertEvent) -> str:
    """One line: what fired where, and the value against its condition."""
    state = state_label(event, upper=True)
    where = f"{event.run}/{event.role} step {event.step}"
    value = "" if event.ended_with_run and event.value is None \
        else f" = {format_value(event.value)}"
    metric = f": {event.metric}{value}" if event.metric else ""
    cond = f" ({event.condition})" if event.condition else ""
    handed = f": {event.handed_to} judges this level and fires now" \
        if event.handed_to and event.state == "resolved" else ""
    detail = handed + (f": {event.detail}" if event.detail else "")
    stop = " [the run was asked to stop]" if event.stop else ""
    cost = f" [{event.cost_note}]" if event.cost_note else ""
    return f"[{state}] {event.alert} on {where}{metric}{cond}{detail}{cost}{stop}"


def state_label(event: AlertEvent, upper: bool = False) -> str:
    """What became of the alert: its severity when it fires (and what it escalated from),
    "resolved", or, for an alert closed because its run ended, its severity and that it was
    still firing then (the run is over, not the condition), or, for an early warning whose
    level rule fires now, to whom it was handed over (the condition goes on). ``upper``: the
    word in capitals, as a one-line summary starts."""
    if event.state == "firing":
        word, why = event.severity, (f", escalated from {event.escalated_from}"
                                     if event.escalated_from else "")
    elif event.ended_with_run:
        word, why = event.severity, ", still firing when the run ended"
    elif event.handed_to:
        word, why = "handed over", f" to {event.handed_to}"
    else:
        word, why = "resolved", ""
    return (word.upper() if upper else word) + why


def transition_label(state: str, ended_with_run: bool = False, handed_to: str = "",
                     escalated_to: str = "") -> str:
    """A stored transition's state as a person reads it: a closing that is no recovery (the
    run ended with the alert firing, or its level rule took it over) is never "resolved", and
    a firing that raised an open incident's severity (``escalated_to``) says so."""
    if state == "firing" and escalated_to:
        return f"escalated to {escalated_to}"
    if state == "resolved" and ended_with_run:
        return "firing when the run ended"
    if state == "resolved" and handed_to:
        return f"handed over to {handed_to}"
    return state


def alert_url(event: AlertEvent, public_url: str | None) -> str | None:
    """The alert's page on the run page (``/#/alert/<run>/<role>/<alert>/<step>``): a firing's
    own onset (an escalation's: it is stored at its step); a resolve's or a re-send's latest
    firing (the page without a step: a re-send is not stored). None without a public URL."""
    if not public_url:
        return None
    parts = [event.run, event.role, event.alert]
    if event.state == "firing" and not event.repeat:
        parts.append(str(event.step))
    return f"{public_url.rstrip('/')}/#/alert/" + "/".join(quote(p, safe="") for p in parts)


def run_url(run: str, role: str, public_url: str | None) -> str | None:
    """The run's page (its curves with every alert marked). None without a public URL."""
    if not public_url:
        return None
    return (f"{public_url.rstrip('/')}/#/run/{quote(run, safe='')}"
            f"?role={quote(role, safe='')}")


def what_to_change(event: AlertEvent) -> str:
    """The detected framework's keys and ranges for a firing (plain words for a home-grown
    loop); "" for a resolve or an alert no key fixes."""
    if event.state != "firing":
        return ""
    return remedies.remedy_text(event.alert, event.framework)


def _framework_label(event: AlertEvent) -> str:
    fw = remedies.framework_of(event.framework)
    return "" if fw == remedies.CUSTOM else f" ({event.framework})"


def cost_json(event: AlertEvent) -> dict[str, Any]:
    """What the condition has cost since its onset (rlmon.service.goodput.cost)."""
    return {"onset": event.onset, "gpus": event.gpus, "gpu_hours": event.gpu_hours,
            "money": event.money, "text": event.cost_note}


def samples_json(event: AlertEvent, state_dir: str | None = None) -> dict[str, Any] | None:
    """The worst samples an alert carries (its first few, payloads cut) and the command that
    prints them all (from the service's state directory); None when it carries none."""
    if not event.samples:
        return None
    return {"metric": event.samples_metric, "items": items_to_json(event.samples),
            "more": command_for(event.run, event.role, event.step, state_dir=state_dir)}


def _slack_samples(event: AlertEvent, state_dir: str | None) -> str:
    lines = [f":microscope: Worst samples ({code(event.samples_metric)}):"]
    for n, (score, ident, payload) in enumerate(event.samples, 1):
        text = " ".join(payload.split())  # one line each
        lines.append(f"{n}. {code(ident)} {format_value(score)}"
                     + (f": {_mrkdwn(text)}" if text else ""))
    command = command_for(event.run, event.role, event.step, state_dir=state_dir)
    lines.append(f"All of them: {code(command)}")
    return "\n".join(lines)


def slack_body(events: Sequence[AlertEvent], dashboard: str | None, username: str,
               state_dir: str | None = None, public_url: str | None = None) -> dict[str, Any]:
    """One Block Kit message for the alerts of one (run, role, step); with ``public_url`` each
    alert links to its page on the run page and the footer to the run."""
    first = events[0]
    firing = [e for e in events if e.state == "firing"]
    worst = "critical" if any(e.severity == "critical" for e in firing) else "warning"
    head_emoji = _EMOJI.get((worst, "firing"), ":white_check_mark:") if firing else (
        ":white_check_mark:"
    )
    counts = []
    if firing:
        counts.append(f"{len(firing)} firing")
    if len(firing) < len(events):
        counts.append(f"{len(events) - len(firing)} resolved")
    title = f"{head_emoji} rlmon: {', '.join(counts)} on {first.run} / {first.role}, step {first.step}"
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": title[:150], "emoji": True}}
    ]
    for event in events:
        icon = _EMOJI.get((event.severity, event.state), ":white_check_mark:")
        lines = [f"{icon} *{_mrkdwn(event.alert)}* ({state_label(event)})"]
        if event.summary:
            lines.append(_mrkdwn(event.summary))
        if event.metric:
            lines.append(
                f"{code(event.metric)} = *{format_value(event.value)}*"
                + (f" (alert when {_mrkdwn(event.condition)})" if event.condition else "")
            )
        if event.detail:
            lines.append(_mrkdwn(event.detail))
        if event.cost_note:
            lines.append(f":money_with_wings: Cost so far: {_mrkdwn(event.cost_note)}")
        if event.stop:
            lines.append(f":octagonal_sign: *{_mrkdwn(event.stop)}*")
        if event.first_moved and event.state == "firing":
            lines.append(f":footprints: What moved first: {own_words(event.first_moved)}")
        page = alert_url(event, public_url)
        if page:
            lines.append(link(page, "Open in rlmon"))
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": "\n".join(lines)}})
        if event.samples:
            blocks.append({"type": "section",
                           "text": {"type": "mrkdwn", "text": _slack_samples(event, state_dir)[:3000]}})
        if event.what_to_check and event.state == "firing":
            blocks.append({
                "type": "context",
                "elements": [{"type": "mrkdwn",
                              "text": f":mag: What to check: {_mrkdwn(event.what_to_check)}"}],
            })
        change = what_to_change(event)
        if change:
            blocks.append({
                "type": "context",
                "elements": [{"type": "mrkdwn", "text": (
                    f":wrench: What to change{_framework_label(event)}: {own_words(change)}")}],
            })
    context = f"run {code(first.run)} · role {code(first.role)} · step {first.step}"
    run_page = run_url(first.run, first.role, public_url)
    if run_page:
        context += " · " + link(run_page, "Open run")
    if dashboard:
        context += " · " + link(dashboard, "Open dashboard")
    blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": context}]})
    fallback = _mrkdwn("; ".join(summary_line(e) for e in events))
    return {"text": fallback[:3000], "blocks": blocks, "username": username}


def pagerduty_body(
    event: AlertEvent, severity_map: dict[str, str], group: str, dashboard: str | None,
    state_dir: str | None = None, public_url: str | None = None,
) -> dict[str, Any]:
    """A v2 event without its routing key: trigger on firing, resolve on resolved; with
    ``public_url`` its links open the alert's page and the run's."""
    if event.state == "resolved":
        return {"event_action": "resolve", "dedup_key": event.dedup_key}
    details: dict[str, Any] = {
        "run": event.run,
        "role": event.role,
        "step": event.step,
        "metric": event.metric,
        "value": format_value(event.value),
        "condition": event.condition,
    }
    if event.what_to_check:
        details["what_to_check"] = event.what_to_check
    change = what_to_change(event)
    if change:
        details["what_to_change"] = change
    if event.framework:
        details["framework"] = event.framework
    if event.first_moved:
        details["first_moved"] = event.first_moved
    page = alert_url(event, public_url)
    if page:
        details["alert_url"] = page
    if event.detail:
        details["detail"] = event.detail
    if event.cost_note:
        details["cost"] = cost_json(event)
    if event.stop:
        details["stop"] = event.stop
    samples = samples_json(event, state_dir)
    if samples is not None:
        details["worst_samples"] = samples
    body: dict[str, Any] = {
        "event_action": "trigger",
        "dedup_key": event.dedup_key,
        "payload": {
            "summary": summary_line(event)[:1024],
            "source": event.run,
            "severity": severity_map.get(event.severity, "warning"),
            "component": event.role,
            "group": group,
            "class": event.alert,
            "custom_details": details,
        },
    }
    links = []
    if page:
        links.append({"href": page, "text": f"rlmon: {event.alert} on {event.run}/{event.role}"})
    run_page = run_url(event.run, event.role, public_url)
    if run_page:
        links.append({"href": run_page, "text": "rlmon run page"})
    if dashboard:
        links.append({"href": dashboard, "text": "rlmon dashboard"})
    if links:
        body["links"] = links
    return body


def webhook_body(events: Sequence[AlertEvent], dashboard: str | None,
                 state_dir: str | None = None, public_url: str | None = None) -> dict[str, Any]:
    """The generic webhook: the replay contract's alert lines plus context, one per step (the
    console notifier prints it too)."""
    first = events[0]
    alerts = []
    for event in events:
        line = event.to_json()
        line.update(summary=event.summary, condition=event.condition,
                    what_to_check=event.what_to_check, dedup_key=event.dedup_key,
                    detail=event.detail, stop=event.stop, text=summary_line(event),
                    framework=event.framework, what_to_change=what_to_change(event),
                    ended_with_run=event.ended_with_run, handed_to=event.handed_to,
                    first_moved=event.first_moved if event.state == "firing" else "")
        page = alert_url(event, public_url)
        if page:
            line["alert_url"] = page
        samples = samples_json(event, state_dir)
        if samples is not None:
            line["worst_samples"] = samples
        if event.cost_note:
            line["cost"] = cost_json(event)
        alerts.append(line)
    body: dict[str, Any] = {
        "version": 1, "source": "rlmon", "run": first.run, "role": first.role,
        "step": first.step, "alerts": alerts,
    }
    run_page = run_url(first.run, first.role, public_url)
    if run_page:
        body["run_url"] = run_page
    if dashboard:
        body["dashboard"] = dashboard
    return body
