"""PagerDuty through the official ``pagerduty`` package (Events API v2).

The client's built-in sleep-and-retry loop is turned off (``max_http_attempts = -1`` and
``max_network_attempts = 0`` hand every 429/5xx response or network error straight back) so the
durable outbox owns retries and Retry-After. The routing key is added by the client at send time;
stored bodies never hold it. ``transport`` is an httpx2 transport seam (tests forward to loopback,
since the client refuses plain-http base URLs).
"""

from __future__ import annotations

import logging
from typing import Any

import httpx2
from pagerduty import EventsApiV2Client
from pagerduty.errors import Error, HttpError

from rlmon.service.alerting.notify.message import Delivery, http_outcome
from rlmon.service.alerting.notify.no_redirects import redirect_outcome
from rlmon.service.redact import Redactor

__all__ = ["PagerDutyNotifier"]

_RETRYABLE = (429, 500, 502, 503, 504)


class PagerDutyNotifier:
    name = "pagerduty"

    def __init__(
        self, routing_key: str, *, base_url: str = "https://events.pagerduty.com",
        timeout: float = 10.0, min_interval: float = 0.5, transport: httpx2.BaseTransport | None = None,
        redactor: Redactor | None = None,
    ) -> None:
        kwargs: dict[str, Any] = {} if transport is None else {"transport": transport}
        self._client = EventsApiV2Client(routing_key, base_url=base_url, **kwargs)
        self._client.timeout = timeout  # type: ignore[assignment]
        self._client.max_http_attempts = -1
        self._client.max_network_attempts = 0
        for status in _RETRYABLE:
            self._client.retry[status] = 1
        self._client.log = logging.getLogger("rlmon.notify.pagerduty.client")
        self._client.log.setLevel(logging.CRITICAL)  # it logs "exceeded attempts" for every 429
        self.min_interval = min_interval
        self._redact = redactor or Redactor([routing_key])

    def __repr__(self) -> str:
        return "PagerDutyNotifier(routing_key=***)"

    def send(self, body: dict[str, Any]) -> Delivery:
        props = {k: v for k, v in body.items() if k not in ("event_action", "dedup_key")}
        try:
            self._client.send_event(body["event_action"], body.get("dedup_key"), **props)
        except HttpError as exc:
            response = exc.response
            if response is None:
                return Delivery("retry", self._redact(f"{type(exc).__name__}: {exc}"))
            if 300 <= response.status_code < 400:  # the client never follows one
                return redirect_outcome(response.status_code, response.headers.get("location"))
            detail = self._redact(f"HTTP {response.status_code}: {response.text[:200]}")
            return http_outcome(response.status_code, detail, response.headers.get("retry-after"))
        except Error as exc:  # network errors, malformed responses
            return Delivery("retry", self._redact(f"{type(exc).__name__}: {exc}"))
        except httpx2.HTTPError as exc:
            return Delivery("retry", self._redact(f"{type(exc).__name__}: {exc}"))
        return Delivery.accepted(202)
