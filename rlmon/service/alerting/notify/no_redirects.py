"""Deliveries never follow a redirect: a notifier's request carries its credentials (a bearer
token, a Slack webhook's secret path, a PagerDuty routing key in the body), and a receiver that
answers 3xx would have them sent to another host, or have a POST turned into a GET without a
body and counted as delivered. A 3xx is a failed attempt instead (:func:`redirect_outcome`),
retried by the outbox and reported with where it pointed, so an operator can fix the URL.
"""

from __future__ import annotations

import ssl
import urllib.request
from typing import Any
from urllib.parse import urlsplit

from rlmon.service.alerting.notify.message import Delivery

__all__ = ["no_redirect_opener", "redirect_outcome"]


class _RefuseRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any,
                         newurl: str) -> None:
        return None  # urllib then raises HTTPError with the 3xx status


def no_redirect_opener(context: ssl.SSLContext | None = None,
                       proxy: str | None = None) -> urllib.request.OpenerDirector:
    """A urllib opener like ``urlopen``'s (proxies from the environment unless ``proxy``) that
    answers a 3xx with ``HTTPError`` instead of following it."""
    handlers: list[Any] = [_RefuseRedirects(), urllib.request.HTTPSHandler(context=context)]
    if proxy:
        handlers.append(urllib.request.ProxyHandler({"http": proxy, "https": proxy}))
    return urllib.request.build_opener(*handlers)


def redirect_outcome(status: int, location: str | None) -> Delivery:
    """A 3xx answer: retried (the receiver may be moving), never followed. Only the scheme and
    host of where it pointed are said (a Location may carry a secret of its own)."""
    parts = urlsplit(location or "")
    where = f" to {parts.scheme}://{parts.hostname}" if parts.hostname else ""
    return Delivery("retry", f"HTTP {status}: the receiver redirects{where}; rlmon does not "
                    "follow a redirect with credentials (set the notifier's URL to where it "
                    "leads)", None, status)
