"""Slack through slack-sdk: an incoming webhook (``WebhookClient``), or a bot token
(``WebClient.chat_postMessage``), with which the messages of one run's notification group after
its first are replies in the first one's thread (the body's ``thread`` key marks a group's message,
its ``thread_ts`` the thread of the group's first one; the bot returns the ts of a message that
opens a thread, which the groups keep in the outbox's file, so a restart keeps the threads).

slack-sdk's own retry handlers are off: a 429 comes back to the outbox, which honours Retry-After
across restarts instead of sleeping in the sending thread.
"""

from __future__ import annotations

import urllib.request
from typing import Any

from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError, SlackRequestError
from slack_sdk.webhook import WebhookClient, WebhookResponse

from rlmon.service.alerting.notify.message import Delivery, http_outcome
from rlmon.service.alerting.notify.no_redirects import no_redirect_opener, redirect_outcome
from rlmon.service.redact import Redactor

__all__ = ["SlackBotNotifier", "SlackNotifier"]



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


class _NoRedirectWebClient(WebClient):
    """slack-sdk's Web API client (the bot mode) with its requests made through an opener that
    does not follow a redirect: the request carries the bot token as a bearer header, which
    urllib would send on to wherever a 3xx points."""

    def _perform_urllib_http_request_internal(self, url: str, req: urllib.request.Request,
                                              ) -> dict[str, Any]:
        if not url.lower().startswith("http"):
            raise SlackRequestError(f"Invalid URL detected: {url}")
        proxy = self.proxy if isinstance(self.proxy, str) else None
        response = no_redirect_opener(self.ssl, proxy).open(req, timeout=self.timeout)
        charset = response.headers.get_content_charset() or "utf-8"
        return {"status": response.status, "headers": response.headers,
                "body": response.read().decode(charset)}


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
        body = {k: v for k, v in body.items() if k not in ("thread", "thread_ts")}  # no threads
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


class SlackBotNotifier:
    """Slack through a bot token: chat.postMessage to one channel, a group's updates in the
    thread of its first message."""

    name = "slack"

    def __init__(
        self, token: str, channel: str, *, base_url: str = "https://slack.com/api/",
        timeout: float = 10.0, min_interval: float = 1.0, redactor: Redactor | None = None,
    ) -> None:
        self._client = _NoRedirectWebClient(token=token, base_url=base_url,
                                 timeout=max(1, round(timeout)), retry_handlers=[])
        self.channel = channel
        self.min_interval = min_interval
        self._redact = redactor or Redactor([token])

    def __repr__(self) -> str:
        return f"SlackBotNotifier(token=***, channel={self.channel!r})"

    def send(self, body: dict[str, Any]) -> Delivery:
        body = dict(body)
        group = body.pop("thread", None)  # a group's message: it opens a thread or replies in it
        thread = body.pop("thread_ts", None)
        try:
            response = self._client.chat_postMessage(channel=self.channel, thread_ts=thread,
                                                     **body)
        except SlackApiError as exc:
            status = exc.response.status_code
            error = str(exc.response.get("error", "")) if exc.response is not None else ""
            retry_after = exc.response.headers.get("Retry-After") or exc.response.headers.get(
                "retry-after")
            if isinstance(retry_after, list):
                retry_after = retry_after[0] if retry_after else None
            if status == 200:  # ok: false (invalid_blocks, channel_not_found ...): permanent
                return Delivery("failed", self._redact(f"Slack API error: {error}"), status=200)
            if 300 <= status < 400:  # answered, never followed (the token is a bearer header)
                location = exc.response.headers.get("Location") or exc.response.headers.get(
                    "location")
                return redirect_outcome(status, location if isinstance(location, str) else None)
            return http_outcome(status, self._redact(f"HTTP {status}: {error}"), retry_after)
        except Exception as exc:  # urllib raises URLError/OSError for a receiver that is down
            return Delivery("retry", self._redact(f"{type(exc).__name__}: {exc}"))
        ts = response.get("ts")
        opened = ts if group and thread is None and isinstance(ts, str) else None
        return Delivery.accepted(response.status_code, thread=opened)
