"""No notifier follows a redirect with its credentials (issue 40, E13): a receiver that answers
3xx gets neither the bearer token, nor the Slack webhook's secret path, nor the PagerDuty routing
key sent on to where it points; the POST is not turned into a GET that counts as delivered. The
attempt is a retry, reported with where the redirect pointed, and delivered once the receiver
answers 2xx. Real clients (urllib, slack-sdk, pagerduty) against real loopback HTTP servers."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from rlmon.service.alerting.notify.dispatcher import Dispatcher
from rlmon.service.alerting.notify.message import Notification
from rlmon.service.alerting.notify.outbox import Backoff, Outbox
from rlmon.service.alerting.notify.pagerduty import PagerDutyNotifier
from rlmon.service.alerting.notify.slack import SlackBotNotifier, SlackNotifier
from rlmon.service.alerting.notify.webhook import WebhookNotifier
from rlmon.service.config import Settings
from tests.support.alerting_support import LoopbackTransport
from tests.support.clock import FakeClock

TOKEN = "hook-Token-123"
KEY = "0123456789abcdef0123456789abcdef"
REDIRECTS = (301, 302, 303, 307, 308)


class Server:
    """A loopback HTTP server recording every request (any method); its answers are scripted:
    ``answers`` is popped per request (status, Location), the default is 200 "ok"."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, dict[str, str], bytes]] = []
        self.answers: list[tuple[int, str | None]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _any(self) -> None:
                length = int(self.headers.get("Content-Length", "0") or 0)
                body = self.rfile.read(length) if length else b""
                server.seen.append((self.command, self.path, dict(self.headers.items()), body))
                status, location = server.answers.pop(0) if server.answers else (200, None)
                data = b"ok" if status < 300 else b""
                self.send_response(status)
                if location:
                    self.send_header("Location", location)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = _any

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self._http.server_address[1])
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self._http.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._http.shutdown()
        self._http.server_close()


@pytest.fixture
def servers() -> Iterator[tuple[Server, Server]]:
    receiver, elsewhere = Server(), Server()
    yield receiver, elsewhere
    receiver.close()
    elsewhere.close()


def _notifiers(receiver: Server) -> list[Any]:
    return [WebhookNotifier(f"{receiver.url}/hook", token=TOKEN),
            SlackNotifier(f"{receiver.url}/services/T0/B0/sEcReT"),
            SlackBotNotifier("xoxb-bot-SeCrEt", "#alerts", base_url=f"{receiver.url}/api/"),
            PagerDutyNotifier(KEY, transport=LoopbackTransport(receiver.port))]


@pytest.mark.parametrize("status", REDIRECTS)
def test_a_redirect_is_a_retry_and_is_never_followed(servers: tuple[Server, Server],
                                                      status: int) -> None:
    receiver, elsewhere = servers
    for notifier in _notifiers(receiver):
        receiver.seen.clear()
        receiver.answers.append((status, f"{elsewhere.url}/collect?from={notifier.name}"))
        body = ({"event_action": "trigger", "dedup_key": "k", "payload": {
            "summary": "s", "source": "rlmon", "severity": "critical"}}
            if notifier.name == "pagerduty" else {"text": "grpo-7b: ISRatioDivergence"})
        delivery = notifier.send(body)
        assert delivery.outcome == "retry", (notifier.name, delivery)
        assert delivery.status == status
        assert "redirects to http://127.0.0.1; rlmon does not follow" in delivery.detail
        assert "collect" not in delivery.detail  # only where it points, not its path
        assert len(receiver.seen) == 1, notifier.name  # asked once, not again elsewhere
    assert elsewhere.seen == []  # neither the token, the secret path nor the routing key


def test_a_redirected_delivery_is_retried_reported_and_then_delivered(
        servers: tuple[Server, Server], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    receiver, elsewhere = servers
    clock = FakeClock(time.time() + 1.0)  # the outbox stamps a new row with the real time
    outbox = Outbox(tmp_path / "outbox.sqlite", backoff=Backoff(10.0, 10.0, 0.0))
    webhook = WebhookNotifier(f"{receiver.url}/hook", token=TOKEN)
    dispatcher = Dispatcher(Settings(), outbox, [webhook], clock=clock)
    outbox.put(Notification("webhook", "grpo-7b/actor/ISRatioDivergence/1", "grpo-7b",
                            {"text": "firing"}))
    receiver.answers.append((302, f"{elsewhere.url}/collect"))
    with caplog.at_level(logging.WARNING):
        assert dispatcher.pump() == 1
    assert dispatcher.stats().outcomes == {("webhook", "retried"): 1}
    assert outbox.pending("webhook") == 1
    assert any("HTTP 302: the receiver redirects" in r.getMessage() for r in caplog.records)
    clock.advance(11.0)  # past the backoff
    assert dispatcher.pump() == 1
    assert dispatcher.stats().outcomes == {("webhook", "retried"): 1, ("webhook", "sent"): 1}
    assert outbox.pending("webhook") == 0
    assert [(m, p) for m, p, _h, _b in receiver.seen] == [("POST", "/hook"), ("POST", "/hook")]
    assert receiver.seen[1][2]["Authorization"] == f"Bearer {TOKEN}"
    assert elsewhere.seen == []
    outbox.close()
