"""Issue 30 through the live service path: a real ServiceCore (history store, outbox, delivery
thread) posting to a loopback webhook receiver. A metric flapping near its threshold is one
notification; a warning that climbs escalates once, after a service restart in between, and the
escalation arrives at the new severity, the resolve closing it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlmon.service.config import Settings
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.metrics import catalog
from rlmon.service.service_core import ServiceCore
from tests.support.alerting_support import Receiver
from tests.support.records import step_record

LOGP = catalog.get("actor/logp_diff").name
T0 = 1_800_000_000.0


def steps(values: list[float], start: int) -> list[StepRecord]:
    return [step_record(run="r", step=start + i, metrics={LOGP: v},
                        finalized_at=T0 + 30.0 * (start + i)) for i, v in enumerate(values)]


def settings(url: str) -> Settings:
    # the run's notification group keeps its timing across the restart: its updates a second
    # apart (the default interval, 60 s, would hold the escalation past the close's drain)
    return Settings.model_validate({
        "notifiers": {"console": {"enabled": False}, "webhook": {"url": f"{url}/hook"},
                      "grouping": {"group_interval_seconds": 1}},
        "routing": {"critical": ["webhook"], "warning": ["webhook"]}})


def delivered(receiver: Receiver) -> list[tuple[str, str, str, str]]:
    out = []
    for request in receiver.accepted("/hook"):
        body: dict[str, Any] = request.body
        out += [(a["alert"], a["state"], a["severity"], a["summary"]) for a in body["alerts"]]
    return out


def test_flapping_is_one_notification_and_an_escalation_survives_a_restart(
        tmp_path: Path) -> None:
    receiver = Receiver().start()
    try:
        core = ServiceCore(settings(receiver.url), state_dir=tmp_path).start()
        # 60 steps over and under LogprobMismatch's 0.1 (two in a row: it fires), never 20
        # good steps in a row
        flapping = [0.12, 0.11, 0.08, 0.09, 0.07] * 12
        core.publish(steps(flapping, 0))
        assert core.close(timeout=30.0)
        again = ServiceCore(settings(receiver.url), state_dir=tmp_path).start()
        climb = [0.12 + 0.02 * i for i in range(15)]  # crosses the critical 0.3 at step 69
        escalated = again.publish(steps(climb, 60))
        good = catalog.RESOLVE_AFTER
        resolved = again.publish(steps([0.01] * good, 75))
        assert again.close(timeout=30.0)
    finally:
        receiver.stop()
    assert [(e.state, e.severity, e.escalated_from) for e in escalated] == [
        ("firing", "critical", "warning")]
    assert escalated[0].step == 60 + next(i for i, v in enumerate(climb) if v >= 0.3)
    assert [(e.state, e.severity, e.step) for e in resolved] == [
        ("resolved", "critical", 75 + good - 1)]
    sent = [(alert, state, severity) for alert, state, severity, _ in delivered(receiver)]
    assert sent == [("LogprobMismatch", "firing", "warning"),
                    ("LogprobMismatch", "firing", "critical"),
                    ("LogprobMismatch", "resolved", "critical")]
    assert "escalated to critical" in delivered(receiver)[1][3]
