"""Slack through slack-sdk's ``WebhookClient``.

slack-sdk's own retry handlers are off: a 429 comes back to the outbox, which honours Retry-After
across restarts instead of sleeping in the sending thread.
"""

from __future__ import annotations

from typing import Any

from slack_sdk.webhook import WebhookClient

from rlmon.service.alerting.notify.message import Delivery, http_outcome
from rlmon.service.redact import Redactor

__all__ = ["SlackNotifier"]


class SlackNotifier:
    name = "slack"

    def __init__(
        self, webhook_url: str, *, timeout: float = 10.0, min_interval: float = 1.0,
        redactor: Redactor | None = None,
    ) -> None:
        self._client = WebhookClient(webhook_url, timeout=max(1, round(timeout)), retry_handlers=[])
        self.min_interval = min_interval
        self._redact = redactor or Redactor([webhook_url])

    def __repr__(self) -> str:
        return "SlackNotifier(webhook_url=***)"

    def send(self, body: dict[str, Any]) -> Delivery:
        try:
            response = self._client.send_dict(body)
        except Exception as exc:  # urllib raises URLError/OSError for a receiver that is down
            return Delivery("retry", self._redact(f"{type(exc).__name__}: {exc}"))
        text = self._redact(str(response.body or ""))[:200]
        headers = {k.lower(): v for k, v in (response.headers or {}).items()}
        retry_after = headers.get("retry-after")
        if isinstance(retry_after, list):
            retry_after = retry_after[0] if retry_after else None
        outcome = http_outcome(response.status_code, f"HTTP {response.status_code}: {text}",
                               retry_after)
        if outcome.outcome == "ok" and text.strip() not in ("", "ok"):
            # a webhook answers plain "ok"; anything else is Slack refusing the payload
            return Delivery("failed", f"HTTP {response.status_code}: {text}", status=200)
        return outcome
