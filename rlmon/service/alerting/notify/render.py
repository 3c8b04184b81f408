"""Render alert events into destination bodies (Slack Block Kit, PagerDuty v2, webhook JSON).

Pure functions of events and settings: what is rendered is what the outbox stores, so a body must
be complete without any credential.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from rlmon.service.alerting.engine import AlertEvent
from rlmon.service.storage.stored_samples import command_for, items_to_json

__all__ = ["cost_json", "format_value", "pagerduty_body", "samples_json", "slack_body",
           "summary_line", "webhook_body"]

_EMOJI = {("critical", "firing"): ":rotating_light:", ("warning", "firing"): ":warning:"}


def format_value(value: float | None) -> str:
    if value is None:
        return "n/a"
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return f"{value:.4g}"


def summary_line(event: AlertEvent) -> str:
    """One line: what fired where, and the value against its condition."""
    state = "RESOLVED" if event.state == "resolved" else event.severity.upper()
    where = f"{event.run}/{event.role} step {event.step}"
    metric = f": {event.metric} = {format_value(event.value)}" if event.metric else ""
    cond = f" ({event.condition})" if event.condition else ""
    detail = f": {event.detail}" if event.detail else ""
    stop = " [the run was asked to stop]" if event.stop else ""
    cost = f" [{event.cost_note}]" if event.cost_note else ""
    return f"[{state}] {event.alert} on {where}{metric}{cond}{detail}{cost}{stop}"


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
    lines = [f":microscope: Worst samples (`{_mrkdwn(event.samples_metric)}`):"]
    for n, (score, ident, payload) in enumerate(event.samples, 1):
        text = " ".join(payload.split())  # one line each
        lines.append(f"{n}. `{_mrkdwn(ident)}` {format_value(score)}"
                     + (f": {_mrkdwn(text)}" if text else ""))
    command = command_for(event.run, event.role, event.step, state_dir=state_dir)
    lines.append(f"All of them: `{command}`")
    return "\n".join(lines)


def _mrkdwn(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_body(events: Sequence[AlertEvent], dashboard: str | None, username: str,
               state_dir: str | None = None) -> dict[str, Any]:
    """One Block Kit message for the alerts of one (run, role, step)."""
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
        state = "resolved" if event.state == "resolved" else event.severity
        lines = [f"{icon} *{_mrkdwn(event.alert)}* ({state})"]
        if event.summary:
            lines.append(_mrkdwn(event.summary))
        if event.metric:
            lines.append(
                f"`{_mrkdwn(event.metric)}` = *{format_value(event.value)}*"
                + (f" (alert when {_mrkdwn(event.condition)})" if event.condition else "")
            )
        if event.detail:
            lines.append(_mrkdwn(event.detail))
        if event.cost_note:
            lines.append(f":money_with_wings: Cost so far: {_mrkdwn(event.cost_note)}")
        if event.stop:
            lines.append(f":octagonal_sign: *{_mrkdwn(event.stop)}*")
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
    context = f"run `{_mrkdwn(first.run)}` · role `{_mrkdwn(first.role)}` · step {first.step}"
    if dashboard:
        context += f" · <{dashboard}|Open dashboard>"
    blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": context}]})
    fallback = "; ".join(summary_line(e) for e in events)
    return {"text": fallback[:3000], "blocks": blocks, "username": username}


def pagerduty_body(
    event: AlertEvent, severity_map: dict[str, str], group: str, dashboard: str | None,
    state_dir: str | None = None,
) -> dict[str, Any]:
    """A v2 event without its routing key: trigger on firing, resolve on resolved."""
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
    if dashboard:
        body["links"] = [{"href": dashboard, "text": "rlmon dashboard"}]
    return body


def webhook_body(events: Sequence[AlertEvent], dashboard: str | None,
                 state_dir: str | None = None) -> dict[str, Any]:
    """The generic webhook: the replay contract's alert lines plus context, one per step."""
    first = events[0]
    alerts = []
    for event in events:
        line = event.to_json()
        line.update(summary=event.summary, condition=event.condition,
                    what_to_check=event.what_to_check, dedup_key=event.dedup_key,
                    detail=event.detail, stop=event.stop, text=summary_line(event))
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
    if dashboard:
        body["dashboard"] = dashboard
    return body
