"""`rlmon replay FILE --alerts-to ...` delivers a recorded run's alerts through real notifiers."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.support.alerting_support import Receiver
from tests.support.cli import run_rlmon
from tests.support.paths import REPO

ROOT = REPO

# step 1 fires both (LogprobMismatch on its second step over 0.1, a warning: under its
# critical 0.3); they resolve at the 20th good step (the pack's hysteresis), step 21
RUN = [
    {"run": "r1", "role": "actor", "step": 0,
     "metrics": {"actor/is_ratio": {"sum": 1, "count": 1}, "actor/logp_diff": {"sum": 0.2, "count": 1}}},
    {"run": "r1", "role": "actor", "step": 1,
     "metrics": {"actor/is_ratio": {"sum": 3, "count": 1}, "actor/logp_diff": {"sum": 0.2, "count": 1}}},
] + [
    {"run": "r1", "role": "actor", "step": n,
     "metrics": {"actor/is_ratio": {"sum": 1, "count": 1}, "actor/logp_diff": {"sum": 0.01, "count": 1}}}
    for n in range(2, 22)
]


def replay(tmp_path: Path, *args: str, env: dict[str, str] | None = None
           ) -> subprocess.CompletedProcess[str]:
    data = tmp_path / "run.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in RUN) + "\n")
    unset: dict[str, str | None] = {key: None for key in (
        "RLMON_SLACK_WEBHOOK_URL", "RLMON_PAGERDUTY_ROUTING_KEY", "RLMON_WEBHOOK_URL")}
    return run_rlmon("replay", data, "--json", *args, env={**unset, **(env or {})})


def test_alerts_to_webhook(tmp_path: Path) -> None:
    receiver = Receiver().start()
    try:
        config = tmp_path / "rlmon.yaml"
        config.write_text("routing: {critical: [webhook], warning: [webhook]}\n")
        out = replay(tmp_path, "--alerts-to", "webhook", "--config", str(config),
                     env={"RLMON_WEBHOOK_URL": f"{receiver.url}/hook"})
        assert out.returncode == 0, out.stderr
        bodies = [r.body for r in receiver.accepted("/hook")]
        assert [b["step"] for b in bodies] == [1, 21]  # one post per step, all alerts in it
        assert sorted(a["alert"] for a in bodies[0]["alerts"]) == [
            "ISRatioDivergence", "LogprobMismatch"]
        assert {a["state"] for a in bodies[1]["alerts"]} == {"resolved"}
        assert "4 alert events -> 2 notifications delivered" in out.stderr
        assert "routed to none of" not in out.stderr
        # the config's routing sends warnings to Slack only: said, not a silent 1 of 4
        config.write_text("routing: {critical: [webhook], warning: [slack]}\n")
        out = replay(tmp_path, "--alerts-to", "webhook", "--config", str(config),
                     env={"RLMON_WEBHOOK_URL": f"{receiver.url}/hook"})
        assert out.returncode == 0, out.stderr
        assert "2 warning alert events routed to none of webhook" in out.stderr
    finally:
        receiver.stop()


def test_alerts_to_console_and_unconfigured(tmp_path: Path) -> None:
    out = replay(tmp_path, "--alerts-to", "console")
    assert out.returncode == 0, out.stderr
    assert "[CRITICAL] ISRatioDivergence on r1/actor step 1" in out.stderr
    assert "what to check:" in out.stderr
    missing = replay(tmp_path, "--alerts-to", "slack")
    assert missing.returncode == 2
    assert "slack not configured" in missing.stderr
    bad = replay(tmp_path, "--alerts-to", "sms")
    assert bad.returncode == 2
    assert "unknown destination 'sms'" in bad.stderr
