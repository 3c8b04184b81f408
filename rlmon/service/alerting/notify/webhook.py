"""A generic JSON webhook (stdlib urllib). Its URL and optional bearer token are secrets (a URL may
carry ``?api_key=...``): neither appears in a repr, an error detail or a log line."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from rlmon.service.alerting.notify.message import Delivery, http_outcome
from rlmon.service.alerting.notify.no_redirects import no_redirect_opener, redirect_outcome
from rlmon.service.redact import Redactor

__all__ = ["WebhookNotifier"]


class WebhookNotifier:
    name = "webhook"

    def __init__(
        self, url: str, *, token: str | None = None, timeout: float = 10.0,
        min_interval: float = 0.0, redactor: Redactor | None = None,
    ) -> None:
        self._url = url
        self._token = token
        self._timeout = timeout
        self.min_interval = min_interval
        self._redact = redactor or Redactor([url, *([token] if token else [])])
        self._opener = no_redirect_opener()  # the token stays with the URL it was set for

    def __repr__(self) -> str:
        return "WebhookNotifier(url=***, token=***)"

    def send(self, body: dict[str, Any]) -> Delivery:
        data = json.dumps(body, allow_nan=False).encode()
        headers = {"Content-Type": "application/json", "User-Agent": "rlmon"}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        request = urllib.request.Request(self._url, data=data, headers=headers, method="POST")
        try:
            with self._opener.open(request, timeout=self._timeout) as response:
                return Delivery.accepted(response.status)
        except urllib.error.HTTPError as exc:
            if 300 <= exc.code < 400:
                return redirect_outcome(exc.code, exc.headers.get("Location"))
            detail = self._redact(f"HTTP {exc.code}: {exc.read()[:200].decode(errors='replace')}")
            return http_outcome(exc.code, detail, exc.headers.get("Retry-After"))
        except (OSError, ValueError) as exc:
            return Delivery("retry", self._redact(f"{type(exc).__name__}: {exc}"))
