"""What flows through the notifier path: a rendered notification and the receiver's verdict.

A :class:`Notification` is what the outbox stores: the destination's *name* and a JSON body that
holds no credential (the notifier adds the webhook URL or routing key at send time).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal, Protocol

__all__ = ["Delivery", "Notification", "Notifier", "http_outcome", "parse_retry_after"]


@dataclass(frozen=True, slots=True)
class Notification:
    """One message for one destination.

    ``key`` deduplicates (the same key is never delivered twice); ``order_key`` serializes: rows
    with the same destination and order key are delivered strictly in submission order, so a
    PagerDuty resolve never overtakes its trigger.
    """

    destination: str
    key: str
    order_key: str
    body: dict[str, Any]
    created: float = 0.0  # unix seconds of the step's finalization (for latency)

    def body_json(self) -> str:
        return json.dumps(self.body, sort_keys=True, allow_nan=False)


@dataclass(frozen=True, slots=True)
class Delivery:
    """The outcome of one attempt.

    ``ok``: the receiver accepted it. ``retry``: try again later (``after`` seconds at the
    earliest, from a Retry-After header). ``failed``: permanent (the receiver rejected the
    payload, e.g. HTTP 400): retrying cannot help. ``thread``: the receiver's id of the thread
    an accepted message opened (a Slack ts), for the group's later messages.
    """

    outcome: Literal["ok", "retry", "failed"]
    detail: str = ""
    after: float | None = None
    status: int | None = None
    thread: str | None = None

    @classmethod
    def accepted(cls, status: int | None = None, thread: str | None = None) -> Delivery:
        return cls("ok", status=status, thread=thread)


class Notifier(Protocol):
    """Sends one stored notification body to its receiver. Must not raise for receiver errors."""

    name: str
    min_interval: float

    def send(self, body: dict[str, Any]) -> Delivery: ...


def http_outcome(status: int, detail: str, retry_after: str | None) -> Delivery:
    """Map an HTTP status onto a delivery outcome (2xx ok; 3xx, 429/408/5xx retry: a redirect
    is never followed, see :mod:`rlmon.service.alerting.notify.no_redirects`; other 4xx
    failed)."""
    if 200 <= status < 300:
        return Delivery.accepted(status)
    if 300 <= status < 400 or status in (408, 425, 429) or status >= 500:
        return Delivery("retry", detail, parse_retry_after(retry_after), status)
    return Delivery("failed", detail, None, status)


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date); None if absent or bad."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    import time
    from email.utils import parsedate_to_datetime

    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None
