"""Serve the exporter: ``/metrics`` (Prometheus text or OpenMetrics) and ``/healthz``, and
beside them, when given, the run page's app (``/``, ``/static/``, ``/api/``: docs/page.md).
Every path answers only a ``Host`` header the server's :class:`HostCheck` allows (421 otherwise:
DNS rebinding, docs/security.md).

A threaded WSGI server of the standard library around client_python's WSGI app; the caller picks
the address (``0.0.0.0`` in a pod, ``127.0.0.1`` in tests).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.process_collector import ProcessCollector

from rlmon.service.export.exporter import MetricsState, RlmonCollector
from rlmon.service.export.host_check import REFUSED, HostCheck

__all__ = ["ARRIVED_ON", "MetricsServer", "build_registry", "serve_metrics"]

Health = Callable[[], "bool | tuple[bool, str]"]
WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]
ARRIVED_ON = "rlmon.arrived_on"  # environ key: the local address the request's connection reached


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass

    def get_environ(self) -> dict[str, Any]:
        environ = super().get_environ()
        environ[ARRIVED_ON] = str(self.connection.getsockname()[0])
        return environ


def build_registry(state: MetricsState, process: bool = True) -> CollectorRegistry:
    """A registry holding only rlmon's collector (and the process collector)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RlmonCollector(state))
    if process:
        ProcessCollector(registry=registry)
    return registry


def _app(registry: CollectorRegistry, health: Health | None,
         web: WsgiApp | None = None, hosts: HostCheck | None = None,
         ) -> Callable[..., Iterable[bytes]]:
    metrics = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        # no fallback to SERVER_NAME: a request without a Host header is refused
        if hosts is not None and not hosts.allows(environ.get("HTTP_HOST"),
                                                  environ.get(ARRIVED_ON)):
            start_response("421 Misdirected Request", [("Content-Type", "text/plain"),
                                                       ("Content-Length", str(len(REFUSED)))])
            return [REFUSED]
        if path == "/healthz":
            verdict = health() if health is not None else True
            ok, reason = verdict if isinstance(verdict, tuple) else (
                verdict, "ok" if verdict else "unhealthy")
            start_response("200 OK" if ok else "503 Service Unavailable",
                           [("Content-Type", "text/plain")])
            return [(reason if ok else f"unhealthy: {reason}").encode() + b"\n"]
        if path in ("/metrics", "/metrics/"):
            return metrics(environ, start_response)
        if web is not None:
            return web(environ, start_response)
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"rlmon exporter: see /metrics and /healthz\n"]

    return app


class MetricsServer:
    """A running exporter; ``port`` is the bound port (useful with port 0)."""

    def __init__(self, server: WSGIServer, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def host(self) -> str:
        return str(self._server.server_address[0])

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5.0)


def serve_metrics(
    state_or_registry: MetricsState | CollectorRegistry, port: int = 9400,
    host: str = "127.0.0.1", health: Health | None = None, web: WsgiApp | None = None,
    hosts: HostCheck | None = None,
) -> MetricsServer:
    """Start serving on a daemon thread; returns at once. Loopback unless ``host`` says otherwise:
    /metrics and /healthz carry no authentication (docs/deploy.md, "Exposing /metrics");
    ``web`` answers every other path (the run page, with its own optional token). ``hosts``:
    the Host names answered on every path (default: those of ``host`` alone)."""
    registry = (
        build_registry(state_or_registry)
        if isinstance(state_or_registry, MetricsState) else state_or_registry
    )
    checked = hosts if hosts is not None else HostCheck(host)
    server = make_server(host, port, _app(registry, health, web, checked), _ThreadingServer,
                         _QuietHandler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1},
                              daemon=True, name="rlmon-metrics")
    thread.start()
    return MetricsServer(server, thread)
