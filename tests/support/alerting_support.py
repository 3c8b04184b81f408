"""Loopback parts for the alerting tests: a recording receiver, a transport, polling, binaries.

The receiver is a real HTTP server on 127.0.0.1 that accepts the Slack webhook, PagerDuty Events
v2 and generic webhook shapes, records every request, and answers from a per-path script (so a
test can make it answer 429 with Retry-After, or stop and restart it on the same port).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx2
import pytest

from rlmon.service.config import Settings
from tests.support.network import free_port
from tests.support.polling import wait_for

__all__ = [
    "LoopbackTransport",
    "PromStack",
    "Receiver",
    "Request",
    "need_binary",
    "wait_for",
    "webhook_settings",
]


def webhook_settings(receiver: Receiver, outbox: Path) -> Settings:
    """Service settings that send every alert, critical or warning, to ``receiver``'s webhook
    (console off), with the outbox at ``outbox``."""
    return Settings.model_validate({
        "notifiers": {"webhook": {"url": f"{receiver.url}/hook"}, "console": {"enabled": False}},
        "routing": {"critical": ["webhook"], "warning": ["webhook"]},
        "outbox": {"path": str(outbox)},
    })


def need_binary(name: str) -> str:
    """The path of an external binary; skip without it, fail with RLMON_REQUIRE_INTEGRATION=1."""
    path = shutil.which(name)
    if path is None:
        message = f"{name} not installed (make system-deps installs it)"
        if os.environ.get("RLMON_REQUIRE_INTEGRATION") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return path


@dataclass(frozen=True, slots=True)
class Request:
    path: str
    headers: dict[str, str]
    body: Any
    at: float  # time.time() when received
    status: int  # what the receiver answered


@dataclass(slots=True)
class _Script:
    responses: deque[tuple[int, dict[str, str], str]] = field(default_factory=deque)


def _default_response(path: str, body: Any) -> tuple[int, dict[str, str], str]:
    if path.startswith("/v2/enqueue"):
        key = body.get("dedup_key", "generated") if isinstance(body, dict) else "generated"
        payload = {"status": "success", "message": "Event processed", "dedup_key": key}
        return 202, {"Content-Type": "application/json"}, json.dumps(payload)
    if path.startswith("/slack"):
        return 200, {"Content-Type": "text/plain"}, "ok"
    return 200, {"Content-Type": "application/json"}, "{}"


class Receiver:
    """A recording HTTP receiver on 127.0.0.1. ``script(path_prefix, status, headers)`` queues
    one non-default answer for the next request to that prefix."""

    def __init__(self, port: int = 0, delay: float = 0.0) -> None:
        self.port = port
        self.delay = delay  # seconds each answer takes (a slow receiver), recorded after it
        self.requests: list[Request] = []
        self.attempts: list[Request] = []  # every request, accepted or not
        self._scripts: dict[str, _Script] = {}
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def script(self, prefix: str, status: int, headers: dict[str, str] | None = None,
               body: str = "") -> None:
        with self._lock:
            self._scripts.setdefault(prefix, _Script()).responses.append(
                (status, headers or {}, body))

    def _answer(self, path: str, body: Any) -> tuple[int, dict[str, str], str]:
        with self._lock:
            for prefix, script in self._scripts.items():
                if path.startswith(prefix) and script.responses:
                    return script.responses.popleft()
        return _default_response(path, body)

    def start(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                raw = self.rfile.read(length)
                try:
                    body: Any = json.loads(raw) if raw else None
                except json.JSONDecodeError:
                    body = raw.decode(errors="replace")
                if receiver.delay:
                    time.sleep(receiver.delay)  # a receiver that is slow to answer
                status, headers, text = receiver._answer(self.path, body)
                request = Request(self.path, dict(self.headers.items()), body, time.time(), status)
                with receiver._lock:
                    receiver.attempts.append(request)
                    if 200 <= status < 300:
                        receiver.requests.append(request)
                data = text.encode()
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                # the sender may hang up first (shutting down); the request is recorded anyway
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        ThreadingHTTPServer.allow_reuse_address = True
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None

    def accepted(self, prefix: str) -> list[Request]:
        with self._lock:
            return [r for r in self.requests if r.path.startswith(prefix)]

    def tried(self, prefix: str) -> list[Request]:
        with self._lock:
            return [r for r in self.attempts if r.path.startswith(prefix)]


class LoopbackTransport(httpx2.BaseTransport):
    """An httpx2 transport that sends every request to a loopback port over plain HTTP.

    The pagerduty client refuses non-https base URLs; this keeps its real request path (headers,
    JSON body, routing key, status handling) and only swaps the network destination.
    """

    def __init__(self, port: int) -> None:
        self.port = port
        self._inner = httpx2.HTTPTransport()

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        request.url = request.url.copy_with(scheme="http", host="127.0.0.1", port=self.port)
        return self._inner.handle_request(request)

    def close(self) -> None:
        self._inner.close()


class PromStack:
    """A real Prometheus scraping an exporter and a real Alertmanager routing to a receiver.

    Short intervals for tests (scrape/eval 1 s, group_wait/group_interval 1 s); everything binds
    127.0.0.1 and Alertmanager's gossip is off (``--cluster.listen-address=``).
    """

    def __init__(self, workdir: Any, exporter_port: int, receiver_url: str, rules_text: str,
                 routing_key: str = "0123456789abcdef0123456789abcdef") -> None:
        self.workdir = workdir
        self.exporter_port = exporter_port
        self.receiver_url = receiver_url
        self.rules_text = rules_text
        self.routing_key = routing_key
        self.prom_port = free_port()
        self.am_port = free_port()
        self.procs: list[Any] = []

    def _write(self) -> tuple[str, str]:
        import yaml

        (self.workdir / "rules.yaml").write_text(self.rules_text)
        prom = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s",
                       "scrape_timeout": "900ms"},
            "rule_files": [str(self.workdir / "rules.yaml")],
            "alerting": {"alertmanagers": [
                {"static_configs": [{"targets": [f"127.0.0.1:{self.am_port}"]}]}]},
            "scrape_configs": [{"job_name": "rlmon", "static_configs": [
                {"targets": [f"127.0.0.1:{self.exporter_port}"]}]}],
        }
        url = self.receiver_url
        slack = {"api_url": f"{url}/slack/T0/B0/amhook", "channel": "#rlhf", "send_resolved": True,
                 "title": '{{ .Status }} {{ .CommonLabels.run }}/{{ .CommonLabels.role }}',
                 "text": '{{ range .Alerts }}{{ .Labels.alertname }} {{ end }}'}
        am = {
            "route": {"receiver": "warning", "group_by": ["run", "role"], "group_wait": "1s",
                      "group_interval": "1s", "repeat_interval": "1h",
                      "routes": [{"matchers": ['severity="critical"'], "receiver": "critical"}]},
            "receivers": [
                {"name": "critical",
                 "pagerduty_configs": [{"url": f"{url}/v2/enqueue",
                                        "routing_key": self.routing_key,
                                        "send_resolved": True}],
                 "slack_configs": [slack],
                 "webhook_configs": [{"url": f"{url}/hook", "send_resolved": True}]},
                {"name": "warning", "slack_configs": [slack]},
            ],
        }
        prom_path, am_path = self.workdir / "prometheus.yml", self.workdir / "alertmanager.yml"
        prom_path.write_text(yaml.safe_dump(prom))
        am_path.write_text(yaml.safe_dump(am))
        return str(prom_path), str(am_path)

    def start(self, prometheus: str, alertmanager: str) -> PromStack:
        import subprocess

        prom_cfg, am_cfg = self._write()
        log = open(self.workdir / "stack.log", "w")  # noqa: SIM115 - lives as long as the stack
        self.procs.append(subprocess.Popen(
            [alertmanager, f"--config.file={am_cfg}", f"--storage.path={self.workdir / 'am'}",
             f"--web.listen-address=127.0.0.1:{self.am_port}", "--cluster.listen-address=",
             f"--web.external-url=http://127.0.0.1:{self.am_port}"],
            stdout=log, stderr=subprocess.STDOUT))
        self.procs.append(subprocess.Popen(
            [prometheus, f"--config.file={prom_cfg}", f"--storage.tsdb.path={self.workdir / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.prom_port}", "--rules.alert.resend-delay=1s"],
            stdout=log, stderr=subprocess.STDOUT))
        wait_for(lambda: self._ready(self.am_port) and self._ready(self.prom_port), 120,
                 "Prometheus and Alertmanager to be ready")
        return self

    @staticmethod
    def _ready(port: int) -> bool:
        import urllib.request

        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=1) as resp:
                return resp.status == 200
        except OSError:
            return False

    def query(self, expr: str) -> list[dict[str, Any]]:
        import urllib.parse
        import urllib.request

        url = (f"http://127.0.0.1:{self.prom_port}/api/v1/query?"
               + urllib.parse.urlencode({"query": expr}))
        with urllib.request.urlopen(url, timeout=30) as resp:
            return list(json.loads(resp.read())["data"]["result"])

    def am_alerts(self) -> list[dict[str, Any]]:
        """The alerts Alertmanager holds as active now (its v2 API leaves resolved ones out)."""
        import urllib.request

        url = f"http://127.0.0.1:{self.am_port}/api/v2/alerts?active=true&silenced=true&inhibited=true"
        with urllib.request.urlopen(url, timeout=30) as resp:
            return [a for a in json.loads(resp.read()) if a["status"]["state"] != "resolved"]

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(10)
            except Exception:
                proc.kill()
        self.procs = []
