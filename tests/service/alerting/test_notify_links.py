"""Through the live service: a firing reaches Slack, PagerDuty and the webhook (the real
slack-sdk and pagerduty clients, urllib, against a loopback receiver) with a link to the alert's
page on rlmon's own run page, the detected framework's keys and what moved first; and the link
opens that alert (the service's own /api/alert answers for it).

PagerDuty goes through :class:`tests.support.alerting_support.LoopbackTransport` (the client
refuses plain-http base URLs), as in test_notify_delivery.
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rlmon.service.config import Settings
from rlmon.service.metrics import catalog as c
from rlmon.service.service_core import ServiceCore
from tests.support.alerting_support import LoopbackTransport, Receiver
from tests.support.polling import wait_for
from tests.support.records import step_record

pytestmark = pytest.mark.slow

RUN = "grpo-7b"
MOVED = ("`actor/logp_diff` rose 4 steps before `actor/is_ratio_min` fell: look at the weight "
         "sync first")


def stale_weights(steps: int = 60) -> list[dict[str, float]]:
    """The weight sync stops at step 40: the mean mismatch rises at once, the smallest IS ratio
    falls four steps later."""
    rng = np.random.default_rng(3)
    out = []
    for t in range(steps):
        diff = 0.02 * float(np.exp(0.05 * rng.standard_normal()))
        low = 0.5 * float(np.exp(0.05 * rng.standard_normal()))
        if t >= 40:
            diff *= 1 + 0.6 * (t - 39)
        if t >= 44:
            low *= 0.6 ** (t - 43)
        out.append({c.LOGP_DIFF: diff, c.IS_RATIO_MIN: low, c.IS_RATIO: 1.0})
    return out


def settings_for(receiver: Receiver, monkeypatch: pytest.MonkeyPatch, public: str) -> Settings:
    monkeypatch.setenv("RLMON_SLACK_WEBHOOK_URL", f"{receiver.url}/slack/T0/B0/x")
    monkeypatch.setenv("RLMON_PAGERDUTY_ROUTING_KEY", "0123456789abcdef0123456789abcdef")
    every = ["slack", "pagerduty", "webhook"]
    return Settings.model_validate({
        "public_url": public,
        "notifiers": {"console": {"enabled": False}, "slack": {"min_interval_seconds": 0},
                      "pagerduty": {"min_interval_seconds": 0},
                      "webhook": {"url": f"{receiver.url}/hook"}},
        "routing": {"critical": every, "warning": every}})


def api_for(link: str, port: int) -> dict[str, Any]:
    """What the run page shows for ``link`` (its hash route, asked of the service's API)."""
    route = urllib.parse.urlsplit(link).fragment  # /alert/<run>/<role>/<alert>/<step>
    _, kind, run, role, alert, step = route.split("/")
    assert kind == "alert"
    query = urllib.parse.urlencode({"run": urllib.parse.unquote(run), "role": role,
                                    "alert": alert, "step": step})
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/alert?{query}", timeout=10) as r:
        return json.loads(r.read())


def test_a_firing_links_to_its_page_and_says_what_to_change(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    receiver = Receiver().start()
    core = ServiceCore(settings_for(receiver, monkeypatch, "https://placeholder.invalid"),
                       state_dir=tmp_path, port=0, host="127.0.0.1",
                       transports={"pagerduty": LoopbackTransport(receiver.port)}).start()
    try:
        core.settings.public_url = f"http://127.0.0.1:{core.port}/"  # the page it serves
        core.set_run_info(RUN, {"framework": "verl"})
        for step, metrics in enumerate(stale_weights()):
            core.publish([step_record(run=RUN, step=step, metrics=metrics)])
        stale = next(e for e in core.spine.commit.events if e.alert == "ISRatioStale")
        assert stale.framework == "verl" and stale.first_moved == MOVED
        wait_for(lambda: any("ISRatioStale" in json.dumps(r.body)
                             for r in receiver.accepted("/v2/enqueue")), 60, "the PD trigger")
        wait_for(lambda: any("ISRatioStale" in json.dumps(r.body)
                             for r in receiver.accepted("/hook")), 60, "the webhook post")
        wait_for(lambda: any("ISRatioStale" in json.dumps(r.body)
                             for r in receiver.accepted("/slack")), 60, "the Slack message")
        link = (f"http://127.0.0.1:{core.port}/#/alert/{RUN}/actor/ISRatioStale/{stale.step}")
        run_page = f"http://127.0.0.1:{core.port}/#/run/{RUN}?role=actor"

        pd = next(r.body for r in receiver.accepted("/v2/enqueue")
                  if r.body.get("payload", {}).get("class") == "ISRatioStale")
        details = pd["payload"]["custom_details"]
        assert details["alert_url"] == link and details["first_moved"] == MOVED
        assert "`algorithm.rollout_correction.rollout_is_threshold` (2 to 5)" in (
            details["what_to_change"])
        assert pd["links"][:2] == [
            {"href": link, "text": f"rlmon: ISRatioStale on {RUN}/actor"},
            {"href": run_page, "text": "rlmon run page"}]
        slack = next(json.dumps(r.body) for r in receiver.accepted("/slack")
                     if "ISRatioStale" in json.dumps(r.body))
        assert f"<{link}|Open in rlmon>" in slack and f"<{run_page}|Open run>" in slack
        assert "What to change (verl)" in slack and "`algorithm.rollout_correction.rollout_is`" \
            in slack
        assert f"What moved first: {MOVED}" in slack
        hook = next(r.body for r in receiver.accepted("/hook")
                    if any(a["alert"] == "ISRatioStale" for a in r.body["alerts"]))
        line = next(a for a in hook["alerts"] if a["alert"] == "ISRatioStale")
        assert line["alert_url"] == link and line["framework"] == "verl"
        assert hook["run_url"] == run_page

        page = api_for(link, core.port)  # the link opens that onset's page
        assert (page["alert"], page["onset"], page["firing"]) == ("ISRatioStale", stale.step,
                                                                 True)
        assert page["metric"] == c.IS_RATIO_MIN
    finally:
        core.close()
        receiver.stop()


def test_relayed_keys_name_the_framework_when_the_integration_said_nothing(
        tmp_path: Path) -> None:
    core = ServiceCore(Settings.model_validate({"notifiers": {"console": {"enabled": False}}}),
                       state_dir=tmp_path).start()
    try:
        core.publish([step_record(run="or", step=0, metrics={
            c.IS_RATIO: 3.0, "openrlhf/policy_loss": 0.1})])
        core.publish([step_record(run="own", step=0, metrics={c.IS_RATIO: 3.0})])
        by_run = {e.run: e for e in core.spine.commit.events if e.alert == "ISRatioDivergence"}
        assert by_run["or"].framework == "openrlhf"
        assert by_run["own"].framework == ""  # a home-grown loop: plain words
    finally:
        core.close()
