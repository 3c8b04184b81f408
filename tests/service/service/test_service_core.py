"""ServiceCore in-process: state that survives a restart (alert state machines, outbox location),
secrets kept out of client-library logs, an honest /healthz, config-driven exporter address, replay
routing to the console, and latency measured from finalization. Real notifier clients against a
loopback receiver; no Ray."""

from __future__ import annotations

import logging
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from rlmon.cli import build_parser
from rlmon.commands.deliver import replay_routing
from rlmon.commands.serve import exporter_address
from rlmon.service.config import ConfigError, RoutingConfig, Settings, load_config
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.export.series import ALERT_FIRING
from rlmon.service.metrics import catalog
from rlmon.service.service_core import ServiceCore
from tests.support.alerting_support import LoopbackTransport, Receiver, wait_for
from tests.support.records import step_record
from tests.support.scrape import scrape

IS_RATIO = catalog.get("actor/is_ratio").name
CLIP = catalog.get("actor/clip_ratio").name
ENTROPY = catalog.get("actor/entropy").name


def step(run: str, n: int, finalized_at: float | None = None, **metrics: float) -> StepRecord:
    return step_record(run=run, step=n, metrics=metrics, finalized_at=finalized_at)


def quiet() -> Settings:
    return Settings.model_validate({"notifiers": {"console": {"enabled": False}}})


def firing_series(core: ServiceCore) -> set[tuple[str, str]]:
    return {(dict(lbl)["run"], dict(lbl)["alert"])
            for name, lbl in scrape(core.metrics) if name == ALERT_FIRING.name}


# --- 3: alert state survives a service restart ---------------------------------------------------

def test_firing_alert_resolves_after_restart(tmp_path: Path) -> None:
    core = ServiceCore(quiet(), state_dir=tmp_path).start()
    (fired,) = core.publish([step("r", 0, **{IS_RATIO: 3.0})])
    assert (fired.alert, fired.state) == ("ISRatioDivergence", "firing")
    core.close()
    again = ServiceCore(quiet(), state_dir=tmp_path).start()
    try:
        good = catalog.RESOLVE_AFTER  # hysteresis: it resolves at the RESOLVE_AFTER-th good step
        events = again.publish([step("r", n, **{IS_RATIO: 1.0}) for n in range(1, good + 1)])
        assert [(e.alert, e.state, e.step) for e in events] == [
            ("ISRatioDivergence", "resolved", good)]
        assert ("r", "ISRatioDivergence") not in firing_series(again)
        # a redelivered old step is still ignored, not evaluated out of order
        assert again.publish([step("r", 0, **{IS_RATIO: 3.0})]) == []
    finally:
        again.close()


def test_pending_counters_and_exported_firing_survive_restart(tmp_path: Path) -> None:
    core = ServiceCore(quiet(), state_dir=tmp_path).start()
    core.publish([step("r", s, **{CLIP: 0.5, ENTROPY: 0.001}) for s in range(3)])
    assert ("r", "EntropyCollapse") in firing_series(core)
    good = catalog.RESOLVE_AFTER  # good steps in a row before they resolve (hysteresis)
    core.publish([step("r", 3, **{CLIP: 0.1, ENTROPY: 1.0})])  # one good step of them
    core.publish([step("s", 0, **{CLIP: 0.5}), step("s", 1, **{CLIP: 0.5})])  # 2 of 3 bad
    core.close()
    again = ServiceCore(quiet(), state_dir=tmp_path).start()
    try:
        fired = again.publish([step("s", 2, **{CLIP: 0.5})])
        assert [(e.alert, e.state) for e in fired] == [("ClipRatioHigh", "firing")]
        # still firing after the restart, and shown so on the run's next step
        assert again.publish([step("r", n, **{CLIP: 0.1, ENTROPY: 1.0})
                              for n in range(4, 2 + good)]) == []
        assert ("r", "EntropyCollapse") in firing_series(again)
        resolved = again.publish([step("r", 2 + good, **{CLIP: 0.1, ENTROPY: 1.0})])
        assert {(e.alert, e.state) for e in resolved} == {
            ("EntropyCollapse", "resolved"), ("ClipRatioHigh", "resolved")}
        assert ("r", "EntropyCollapse") not in firing_series(again)
    finally:
        again.close()


# --- 2: outbox.path ------------------------------------------------------------------------------

@pytest.mark.parametrize("configured", [None, "queue/notify.sqlite", "ABS"])
def test_outbox_path_from_config(tmp_path: Path, configured: str | None) -> None:
    state = tmp_path / "state"
    if configured == "ABS":
        configured = str(tmp_path / "elsewhere" / "ob.sqlite")
    settings = Settings.model_validate({"outbox": {"path": configured}} if configured else {})
    core = ServiceCore(settings, state_dir=state).start()
    try:
        expected = {None: state / "outbox.sqlite",
                    "queue/notify.sqlite": state / "queue" / "notify.sqlite"}.get(
            configured, Path(str(configured)))
        assert Path(core.dispatcher.outbox.path) == expected
        assert expected.exists()
    finally:
        core.close()


# --- 4: secrets never reach the log --------------------------------------------------------------

def test_client_library_debug_logs_are_redacted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    receiver = Receiver().start()
    secret_path = "/slack/T0SECRET/B0SECRET/xoxSECRETtoken"
    routing_key = "R0UT1NGK3Y" + "0" * 22
    monkeypatch.setenv("RLMON_SLACK_WEBHOOK_URL", receiver.url + secret_path)
    monkeypatch.setenv("RLMON_PAGERDUTY_ROUTING_KEY", routing_key)
    settings = Settings.model_validate({"notifiers": {
        "console": {"enabled": False}, "slack": {"min_interval_seconds": 0},
        "pagerduty": {"min_interval_seconds": 0}}})
    caplog.set_level(logging.DEBUG)
    core = ServiceCore(settings, state_dir=tmp_path,
                       transports={"pagerduty": LoopbackTransport(receiver.port)}).start()
    try:
        core.publish([step("r", 0, **{IS_RATIO: 3.0})])
        wait_for(lambda: receiver.accepted("/slack") and receiver.accepted("/v2/enqueue"), 60,
                 "slack and pagerduty deliveries")
        wait_for(lambda: core.dispatcher.stats().outcomes.get(("slack", "sent")), 60, "ack")
    finally:
        core.close()
        receiver.stop()
    logged = [r for r in caplog.records if r.name.startswith(("slack_sdk", "urllib3", "httpx",
                                                              "httpcore", "pagerduty"))]
    assert logged, "the client libraries logged nothing at DEBUG: the test proves nothing"
    text = caplog.text + "\n".join(r.getMessage() for r in caplog.records)
    assert "T0SECRET" not in text and "xoxSECRETtoken" not in text
    assert routing_key not in text


# --- 10: health, Slack URL validation ------------------------------------------------------------

def _health(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_healthz_reports_dead_delivery_threads_and_closed_history(tmp_path: Path) -> None:
    core = ServiceCore(Settings(), state_dir=tmp_path, port=0, host="127.0.0.1").start()
    try:
        assert core.port is not None
        assert _health(core.port) == (200, "ok\n")
        dispatcher: Any = core.dispatcher
        dispatcher._stop.set()  # the delivery threads end as if they had crashed
        for event in dispatcher._wake.values():
            event.set()
        for thread in dispatcher._threads:
            thread.join(60)
        assert not [t for t in dispatcher._threads if t.is_alive()]
        dispatcher._stop.clear()
        status, body = _health(core.port)
        assert status == 503 and "rlmon-notify-console" in body
        dispatcher._threads = []
        assert _health(core.port)[0] == 200
        core.history.close()
        assert _health(core.port) == (503, "unhealthy: history store closed\n")
    finally:
        core.dispatcher.stop()
        core.ports.close()


def test_slack_url_without_scheme_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLMON_SLACK_WEBHOOK_URL", "hooks.slack.com/services/T0/B0/sekrit")
    with pytest.raises(ConfigError, match=r"notifiers\.slack\.webhook_url") as info:
        load_config()
    assert "sekrit" not in str(info.value)
    monkeypatch.setenv("RLMON_SLACK_WEBHOOK_URL", "https://hooks.slack.com/services/T0/B0/x")
    assert load_config().notifiers.slack.ready


# --- 6: exporter address from the config ---------------------------------------------------------

def test_serve_takes_exporter_port_and_host_from_config(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("exporter: {port: 9555, host: 127.0.0.1}\n")
    settings = load_config(cfg)
    args = build_parser().parse_args(["serve", "--config", str(cfg)])
    assert exporter_address(args, settings) == (9555, "127.0.0.1")
    args = build_parser().parse_args(["serve", "--port", "9600", "--host", "0.0.0.0"])
    assert exporter_address(args, settings) == (9600, "0.0.0.0")


def test_exporter_binds_loopback_unless_asked() -> None:
    """/metrics and /healthz are unauthenticated: nothing serves them beyond this machine unless
    an address is asked for (the Helm chart asks for the pod's)."""
    from rlmon.service.export.exporter import MetricsState
    from rlmon.service.export.http import serve_metrics

    args = build_parser().parse_args(["serve"])
    assert exporter_address(args, load_config(None))[1] == "127.0.0.1"
    server = serve_metrics(MetricsState(), 0)
    try:
        assert server.host == "127.0.0.1"
    finally:
        server.close()


# --- 8: replay routing ---------------------------------------------------------------------------

def test_console_gets_every_replayed_alert_when_named() -> None:
    routing = RoutingConfig.model_validate({
        "critical": ["pagerduty"], "warning": ["slack"],
        "runs": [{"run": "exp-*", "warning": ["webhook"]}]})
    chosen = replay_routing(routing, ["console", "slack"])
    assert chosen.destinations("r", "critical") == ["console"]
    assert chosen.destinations("r", "warning") == ["slack", "console"]
    assert chosen.destinations("exp-1", "warning") == ["console"]
    assert replay_routing(routing, ["slack"]).destinations("r", "critical") == []
    everything = replay_routing(routing, ["slack", "pagerduty"], all_severities=True)
    assert everything.destinations("r", "warning") == ["slack", "pagerduty"]


# --- 9: latency from finalization ----------------------------------------------------------------

def test_dispatch_latency_is_measured_from_finalization(tmp_path: Path) -> None:
    settings = Settings.model_validate({"routing": {"critical": ["console"]}})
    core = ServiceCore(settings, state_dir=tmp_path).start()
    try:
        core.publish([step("r", 0, finalized_at=time.time() - 30.0, **{IS_RATIO: 3.0})])
        latency = wait_for(lambda: list(core.dispatcher.latencies), 60, "a delivery")
        assert latency[0] >= 30.0
    finally:
        core.close()


# --- issue 12: one owner per outbox row during a graceful shutdown ------------------------------

def test_graceful_close_sends_a_pending_notification_once(tmp_path: Path) -> None:
    """The delivery thread is still sending when close() drains: a slow receiver (0.3 s) used
    to get the firing twice, once from the thread and once from the drain."""
    receiver = Receiver(delay=0.3).start()
    try:
        settings = Settings.model_validate({
            "notifiers": {"console": {"enabled": False},
                          "webhook": {"url": f"{receiver.url}/hook"}},
            "routing": {"critical": ["webhook"]},
        })
        core = ServiceCore(settings, state_dir=tmp_path).start()
        core.publish([step("r", 0, **{IS_RATIO: 3.0})])  # wakes the delivery thread
        assert core.close(timeout=10.0)
        assert len(receiver.accepted("/hook")) == 1
    finally:
        receiver.stop()


# --- issue 12: the generic webhook's URL is a secret ---------------------------------------------

def test_webhook_url_credential_stays_out_of_logs_outbox_and_repr(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    import sqlite3

    secret = "api_key=wh0123456789sEcReT"
    receiver = Receiver().start()
    # a receiver (or the proxy before it) that quotes the request line in its error
    receiver.script("/hook", 500, body=f"upstream failed for POST /hook?{secret}")
    monkeypatch.setenv("RLMON_WEBHOOK_URL", f"{receiver.url}/hook?{secret}")
    try:
        settings = load_config(None, notifiers={"console": {"enabled": False}},
                               routing={"critical": ["webhook"]},
                               outbox={"backoff_initial_seconds": 60.0})
        core = ServiceCore(settings, state_dir=tmp_path).start()
        with caplog.at_level(logging.INFO):
            core.publish([step("r", 0, **{IS_RATIO: 3.0})])
            wait_for(lambda: receiver.tried("/hook"), 30, "the first (failing) attempt")
            db = sqlite3.connect(core.dispatcher.outbox.path)
            errors = wait_for(lambda: [e for (e,) in db.execute("SELECT last_error FROM outbox")
                                       if e], 30, "the retry to be scheduled")
            db.close()
        notifier = repr(core.dispatcher.notifiers["webhook"])
        core.close(timeout=0.1)
        assert "HTTP 500" in errors[0]
        for where, text in (("outbox last_error", errors[0]), ("log", caplog.text),
                            ("repr", notifier)):
            assert "sEcReT" not in text, where
        assert "HTTP 500" in caplog.text
    finally:
        receiver.stop()
