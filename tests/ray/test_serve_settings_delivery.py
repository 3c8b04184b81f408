"""Settings reach the service whole, or the start fails (issue 40, E1).

``rlmon serve --address`` joins a Ray started elsewhere (here the test session's, started by the
pytest process without any RLMON_ variable): the service actor runs in a Ray worker with Ray's
environment, not serve's. Settings given to serve only through its environment (the page token,
``public_url``, the Slack webhook, the PagerDuty key, the webhook URL and token, the routes)
must all be in force in the service; no secret may land in serve's output, Ray's logs or the
state directory; and a serve whose settings differ from a service already running in the
namespace fails to start rather than silently joining it."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.support.alerting_support import Receiver
from tests.support.network import free_port
from tests.support.polling import CHILD_RUN_S, PATIENCE_S, wait_for

pytestmark = pytest.mark.ray

TOKEN = "page-token-5ecret-a1b2c3"
PD_KEY = "pd0123456789abcdef5ecret0123456789"
HOOK_TOKEN = "hook-bearer-5ecret-xyz"


def _status(url: str, headers: dict[str, str] | None = None) -> int:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return -1


def _serve(gcs: str, namespace: str, port: int, state: Path, env: dict[str, str],
           ) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "rlmon", "serve", "--address", gcs, "--namespace", namespace,
         "--port", str(port), "--host", "127.0.0.1", "--state-dir", str(state)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _stop(proc: subprocess.Popen[str]) -> str:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=PATIENCE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return out


def test_serve_address_delivers_every_setting_from_its_environment(
        ray_cluster: Any, ray_namespace: str, tmp_path: Path) -> None:
    from rlmon.actors.reporter import Reporter

    gcs = ray_cluster.get_runtime_context().gcs_address
    receiver = Receiver().start()
    port = free_port()
    public = f"http://rlmon-e1.example:{port}"
    secrets = {"RLMON_EXPORTER__TOKEN": TOKEN,
               "RLMON_SLACK_WEBHOOK_URL": f"{receiver.url}/slack/5ecret-hook",
               "RLMON_PAGERDUTY_ROUTING_KEY": PD_KEY,
               "RLMON_WEBHOOK_URL": f"{receiver.url}/hook?api_key=5ecret-url-key",
               "RLMON_WEBHOOK_TOKEN": HOOK_TOKEN}
    given = {**secrets, "RLMON_PUBLIC_URL": public,
             "RLMON_ROUTING__CRITICAL": '["slack", "webhook", "pagerduty"]',
             "RLMON_NOTIFIERS__SLACK__MIN_INTERVAL_SECONDS": "0"}
    # Ray's workers have none of these settings (CI's environment has other RLMON_ switches)
    assert not set(given) & set(os.environ)
    env = {**os.environ, **given}
    state = tmp_path / "state"
    proc = _serve(gcs, ray_namespace, port, state, env)
    output = ""
    try:
        base = f"http://127.0.0.1:{port}"
        wait_for(lambda: _status(f"{base}/healthz") == 200 or proc.poll() is not None, PATIENCE_S,
                 "serve to become healthy")
        assert proc.poll() is None
        # the token: the API answers only with it
        assert _status(f"{base}/api/runs") == 401
        assert _status(f"{base}/api/runs", {"Authorization": f"Bearer {TOKEN}"}) == 200
        # public_url: its host is one the page may be reached by
        assert _status(f"{base}/healthz", {"Host": f"rlmon-e1.example:{port}"}) != 421
        assert _status(f"{base}/api/runs", {"Host": f"rlmon-e1.example:{port}",
                                            "Authorization": f"Bearer {TOKEN}"}) == 200
        # each notifier: an alert reaches Slack and the webhook for real (PagerDuty's
        # address cannot be a loopback one: its key is seen in the destinations below)
        rep = Reporter("e1-run", "actor", world={"dp": 1}, rank={"dp": 0},
                       namespace=ray_namespace, start_service=False, step_seconds=False)
        for step in range(4):
            rep.record("actor/loss", sum=math.nan, count=1.0)
            rep.end_step(step)
        assert rep.flush(PATIENCE_S)
        wait_for(lambda: receiver.accepted("/slack") and receiver.accepted("/hook"), PATIENCE_S,
                 "the alert at Slack and the webhook")
        hook = receiver.accepted("/hook")[0]
        assert hook.path == "/hook?api_key=5ecret-url-key"
        assert hook.headers.get("Authorization") == f"Bearer {HOOK_TOKEN}"
        assert public in str(receiver.accepted("/slack")[0].body)  # links on public_url
        rep.close(timeout=1)
    finally:
        output = _stop(proc)
        receiver.stop()
    assert "alerts to" in output and all(
        d in output.split("alerts to", 1)[1].split(";", 1)[0]
        for d in ("slack", "pagerduty", "webhook")), output
    assert "open to anyone" not in output and "no receiver configured" not in output
    # no secret in serve's output, Ray's logs of this session or the state directory
    session = Path(ray_cluster._private.worker._global_node.get_session_dir_path())
    places = [p for p in (*state.rglob("*"), *session.joinpath("logs").rglob("*"))
              if p.is_file()]
    needles = [v.encode() for v in secrets.values()] + [b"5ecret"]
    for needle in needles:
        assert needle.decode() not in output
        for place in places:
            with place.open("rb") as handle:
                assert needle not in handle.read(), f"{needle!r} in {place}"


def test_serve_with_other_settings_than_the_running_service_fails_to_start(
        ray_cluster: Any, ray_namespace: str, tmp_path: Path) -> None:
    gcs = ray_cluster.get_runtime_context().gcs_address
    port = free_port()
    first = _serve(gcs, ray_namespace, port, tmp_path / "state",
                   {**os.environ, "RLMON_EXPORTER__TOKEN": TOKEN})
    try:
        wait_for(lambda: _status(f"http://127.0.0.1:{port}/healthz") == 200
                 or first.poll() is not None, PATIENCE_S, "the first serve to become healthy")
        second = subprocess.run(
            [sys.executable, "-m", "rlmon", "serve", "--address", gcs, "--namespace",
             ray_namespace, "--port", str(port), "--host", "127.0.0.1", "--state-dir",
             str(tmp_path / "state"), "--detached"],
            env={**os.environ, "RLMON_EXPORTER__TOKEN": "another-token"},
            capture_output=True, text=True, timeout=CHILD_RUN_S)
        assert second.returncode == 1, second.stdout + second.stderr
        assert "already runs in namespace" in second.stderr and "other settings" in second.stderr
        assert "another-token" not in second.stdout + second.stderr
        # the running service kept its own settings
        assert _status(f"http://127.0.0.1:{port}/api/runs",
                       {"Authorization": f"Bearer {TOKEN}"}) == 200
    finally:
        _stop(first)


def test_an_auto_started_service_gets_the_starters_environment(
        ray_cluster: Any, ray_namespace: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A Reporter's auto-start (``ensure_runtime`` in the training process): the token set in
    that process's environment, not in Ray's workers', guards the service it starts."""
    from rlmon.actors.runtime import RuntimeOptions, ensure_runtime, shutdown_runtime

    monkeypatch.setenv("RLMON_EXPORTER__TOKEN", TOKEN)
    port = free_port()
    ensure_runtime(ray_namespace, RuntimeOptions(state_dir=str(tmp_path), port=port,
                                                 host="127.0.0.1"))
    try:
        assert _status(f"http://127.0.0.1:{port}/api/runs") == 401
        assert _status(f"http://127.0.0.1:{port}/api/runs",
                       {"Authorization": f"Bearer {TOKEN}"}) == 200
    finally:
        assert shutdown_runtime(ray_namespace)
