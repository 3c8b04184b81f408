"""The run page's WSGI app: ``/`` and ``/static/`` (the page, shipped in the package) and
``/api/`` (:mod:`rlmon.service.web.api`), mounted beside ``/metrics`` on the exporter's server.

With a token configured (``exporter.token_file`` or ``RLMON_EXPORTER__TOKEN``), the page and the
API answer only a request that carries it: ``Authorization: Bearer <token>``, or the cookie that
opening ``/?token=<token>`` once sets. ``/metrics`` and ``/healthz`` stay as they are (probes and
scrapers). See docs/page.md.
"""

from __future__ import annotations

import hmac
import logging
import threading
from collections.abc import Callable, Iterable
from http import HTTPStatus
from importlib import resources
from typing import Any
from urllib.parse import parse_qsl

from rlmon.service.web.api import ApiError, WebApi

__all__ = ["COOKIE", "CacheWarmer", "WebApp"]

COOKIE = "rlmon_token"
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
    is not held up."""

    def __init__(self, api: WebApi, period: float = 5.0) -> None:
        self.api, self.period = api, period
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rlmon-web-warm", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.api.warm()
            except Exception as exc:  # the store closing under it, a run pruned meanwhile
                _log.debug("rlmon: web cache warm-up: %s", exc)
            self._stop.wait(self.period)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5.0)


class WebApp:
    """Routes the page's requests; ``token`` None: open (the exporter's bind rules apply)."""

    def __init__(self, api: WebApi, token: str | None = None) -> None:
        self.api = api
        self._token = token

    def _authorized(self, environ: dict[str, Any]) -> bool:
        if not self._token:
            return True
        header = environ.get("HTTP_AUTHORIZATION", "")
        given = header[7:] if header.startswith("Bearer ") else ""
        if not given:
            for part in environ.get("HTTP_COOKIE", "").split(";"):
                key, _, value = part.strip().partition("=")
                if key == COOKIE:
                    given = value
        return hmac.compare_digest(given.encode(), self._token.encode())

    def __call__(self, environ: dict[str, Any], start_response: StartResponse,
                 ) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "") or "/"
        params = dict(parse_qsl(environ.get("QUERY_STRING", ""), keep_blank_values=True))
        if environ.get("REQUEST_METHOD", "GET") not in ("GET", "HEAD"):
            return self._reply(start_response, 405, "text/plain", b"the page is read-only\n")
        if (path == "/" and self._token and "token" in params
                and hmac.compare_digest(params["token"].encode(), self._token.encode())):
            start_response(_status(303), [
                ("Location", "./"),
                ("Set-Cookie", f"{COOKIE}={self._token}; HttpOnly; SameSite=Strict; Path=/")])
            return [b""]
        if not self._authorized(environ):
            return self._reply(start_response, 401, "text/plain",
                               b"rlmon: this page needs the token (Authorization: Bearer, or "
                               b"open /?token=... once)\n",
                               [("WWW-Authenticate", 'Bearer realm="rlmon"')])
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
    import json

    return json.dumps({"error": message}).encode()
