"""The run page's WSGI app: ``/`` and ``/static/`` (the page, shipped in the package) and
``/api/`` (:mod:`rlmon.service.web.api`), mounted beside ``/metrics`` on the exporter's server.

With a token configured (``exporter.token_file`` or ``RLMON_EXPORTER__TOKEN``), the API answers
only a request that carries it, ``Authorization: Bearer <token>`` (any case of "bearer"), or the
page key derived from it (an HMAC of the token under a secret drawn at each start of the
service) that the page asks for once with the token and keeps in the browser's storage of this
origin (scheme, host and port: a server on another port never sees it; no cookie is set,
cookies ignore ports). The page's own files hold no data and are served to anyone. ``/metrics``
and ``/healthz`` need no token (probes and scrapers).

Every request's Host header is checked, here and by the exporter's server for every path
(:mod:`rlmon.service.export.host_check`). See docs/page.md and docs/security.md.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import threading
from collections.abc import Callable, Iterable
from http import HTTPStatus
from importlib import resources
from typing import Any
from urllib.parse import parse_qsl

from rlmon.service.export.host_check import REFUSED, HostCheck
from rlmon.service.export.http import ARRIVED_ON
from rlmon.service.web.api import ApiError, WebApi

__all__ = ["CacheWarmer", "HostCheck", "WebApp", "page_key"]

_log = logging.getLogger("rlmon.web")
_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
          ".css": "text/css; charset=utf-8", ".txt": "text/plain; charset=utf-8",
          ".md": "text/plain; charset=utf-8"}
StartResponse = Callable[..., Any]


def _status(code: int) -> str:
    return f"{code} {HTTPStatus(code).phrase}"


def _static(name: str) -> tuple[str, bytes] | None:
    """A file of the page shipped in the package (no directory walking: one flat folder)."""
    if "/" in name or name.startswith(".") or not name:
        return None
    suffix = name[name.rfind("."):]
    if suffix not in _TYPES and name != "LICENSE":
        return None
    path = resources.files("rlmon.service.web") / "static" / name
    if not path.is_file():
        return None
    return _TYPES.get(suffix, "text/plain; charset=utf-8"), path.read_bytes()


class CacheWarmer:
    """A daemon thread that keeps the curves of the most recently active streams cached (every
    ``period`` seconds it reads their new steps through the page's own connection), so opening
    a long run does not wait for its first read. SQLite runs without the GIL: the alert path
    is not held up. The thread starts with :meth:`start`, never with the constructor."""

    def __init__(self, api: WebApi, period: float = 5.0) -> None:
        self.api, self.period = api, period
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> CacheWarmer:
        """Start warming (idempotent); returns the warmer."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="rlmon-web-warm",
                                            daemon=True)
            self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.api.warm()
            except Exception as exc:  # the store closing under it, a run pruned meanwhile
                _log.debug("rlmon: web cache warm-up: %s", exc)
            self._stop.wait(self.period)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)


def page_key(token: str, secret: bytes) -> str:
    """The value the page keeps instead of the token (a browser never stores the token): an
    HMAC of the token under ``secret``, which each start of the service draws anew and keeps in
    memory only, so a key from an earlier start, or from a server on another port, is refused."""
    return hmac.new(secret, b"rlmon run page key\n" + token.encode(), hashlib.sha256).hexdigest()


class WebApp:
    """Routes the page's requests; ``token`` None: open (the exporter's bind rules apply)."""

    def __init__(self, api: WebApi, token: str | None = None,
                 hosts: HostCheck | None = None) -> None:
        self.api = api
        self._token = token
        # drawn at each start (never stored): a key handed out before a restart is refused
        self._key = page_key(token, os.urandom(32)) if token else None
        self.hosts = hosts or HostCheck("127.0.0.1")

    def _bearer(self, environ: dict[str, Any]) -> str:
        scheme, _, given = environ.get("HTTP_AUTHORIZATION", "").strip().partition(" ")
        return given.strip() if scheme.lower() == "bearer" else ""

    def _authorized(self, environ: dict[str, Any]) -> bool:
        if not self._token or not self._key:
            return True
        given = self._bearer(environ).encode("latin-1", "replace")
        # both compared, in constant time, whichever matches
        token_ok = hmac.compare_digest(given, self._token.encode())
        key_ok = hmac.compare_digest(given, self._key.encode())
        return token_ok | key_ok

    def __call__(self, environ: dict[str, Any], start_response: StartResponse,
                 ) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "") or "/"
        params = dict(parse_qsl(environ.get("QUERY_STRING", ""), keep_blank_values=True))
        if environ.get("REQUEST_METHOD", "GET") not in ("GET", "HEAD"):
            return self._reply(start_response, 405, "text/plain", b"the page is read-only\n")
        if not self.hosts.allows(environ.get("HTTP_HOST"), environ.get(ARRIVED_ON)):
            return self._reply(start_response, 421, "text/plain", REFUSED)
        if path.startswith("/api/") and not self._authorized(environ):
            return self._reply(start_response, 401, "application/json",
                               _error("this page needs the token: open /#token=<token> once, "
                                      "or send Authorization: Bearer <token>"),
                               [("WWW-Authenticate", 'Bearer realm="rlmon"')])
        if path == "/api/key":
            # the page trades the token (not a key) for the key it keeps
            if not self._token or not self._key:
                return self._reply(start_response, 200, "application/json", b'{"key": null}')
            given = self._bearer(environ).encode("latin-1", "replace")
            if not hmac.compare_digest(given, self._token.encode()):
                return self._reply(start_response, 401, "application/json",
                                   _error("the key is given for the token only"))
            return self._reply(start_response, 200, "application/json",
                               json.dumps({"key": self._key}).encode(),
                               [("Cache-Control", "no-store")])
        if path.startswith("/api/"):
            try:
                kind, body = self.api.handle(path, params)
            except ApiError as exc:
                return self._reply(start_response, exc.status, "application/json",
                                   _error(str(exc)))
            except Exception as exc:  # a page request never takes the server down
                _log.exception("rlmon: web API %s failed", path)
                return self._reply(start_response, 500, "application/json",
                                   _error(f"{type(exc).__name__}: {exc}"))
            extra = []
            if path == "/api/trace":
                run = params.get("run", "run").replace('"', "")
                extra.append(("Content-Disposition",
                              f'attachment; filename="{run}.pftrace"'))
            return self._reply(start_response, 200, kind, body, extra)
        if path == "/favicon.ico":
            return self._reply(start_response, 204, "image/x-icon", b"")
        name = "index.html" if path in ("/", "/index.html") else (
            path[len("/static/"):] if path.startswith("/static/") else "")
        found = _static(name)
        if found is None:
            return self._reply(start_response, 404, "text/plain",
                               b"rlmon: not found; the page is at /, metrics at /metrics\n")
        kind, body = found
        return self._reply(start_response, 200, kind, body, [("Cache-Control", "no-cache")])

    @staticmethod
    def _reply(start_response: StartResponse, code: int, kind: str, body: bytes,
               extra: Iterable[tuple[str, str]] = ()) -> Iterable[bytes]:
        start_response(_status(code), [("Content-Type", kind),
                                       ("Content-Length", str(len(body))), *extra])
        return [body]


def _error(message: str) -> bytes:
    return json.dumps({"error": message}).encode()
