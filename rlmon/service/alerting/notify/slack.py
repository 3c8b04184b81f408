"""Slack through slack-sdk's ``WebhookClient``.

slack-sdk's own retry handlers are off: a 429 comes back to the outbox, which honours Retry-After
across restarts instead of sleeping in the sending thread.
"""

from __future__ import annotations

import urllib.request
from typing import Any

from slack_sdk.errors import SlackRequestError
from slack_sdk.webhook import WebhookClient, WebhookResponse

from rlmon.service.alerting.notify.message import Delivery, http_outcome
from rlmon.service.alerting.notify.no_redirects import no_redirect_opener, redirect_outcome
from rlmon.service.redact import Redactor

__all__ = ["SlackNotifier"]


class _NoRedirectClient(WebhookClient):
    """slack-sdk's client with its one request made through an opener that does not follow a
    redirect (the webhook URL's path is the secret; a 3xx comes back as an HTTP error, which the
    client returns as a response with that status)."""

    def _perform_http_request_internal(self, url: str, req: urllib.request.Request,
                                       ) -> WebhookResponse:
        if not url.lower().startswith("http"):
            raise SlackRequestError(f"Invalid URL detected: {url}")
        response = no_redirect_opener(self.ssl, self.proxy).open(req, timeout=self.timeout)
        charset = response.headers.get_content_charset() or "utf-8"
        return WebhookResponse(url=url, status_code=response.status,
                               body=response.read().decode(charset),
                               headers=response.headers)


class SlackNotifier:
    name = "slack"

    def __init__(
        self, webhook_url: str, *, timeout: float = 10.0, min_interval: float = 1.0,
        redactor: Redactor | None = None,
    ) -> None:
        self._client = _NoRedirectClient(webhook_url, timeout=max(1, round(timeout)),
                                         retry_handlers=[])
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
        if 300 <= response.status_code < 400:
            location = headers.get("location")
            return redirect_outcome(response.status_code,
                                    location[0] if isinstance(location, list) else location)
        outcome = http_outcome(response.status_code, f"HTTP {response.status_code}: {text}",
                               retry_after)
        if outcome.outcome == "ok" and text.strip() not in ("", "ok"):
            # a webhook answers plain "ok"; anything else is Slack refusing the payload
            return Delivery("failed", f"HTTP {response.status_code}: {text}", status=200)
        return outcome
