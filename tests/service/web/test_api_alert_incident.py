"""The page's alert data (``/api/alert``) tells one incident as the notifications do (issue 39):
a warning that escalated is critical now, with the critical level and the step it was crossed;
its cost, what to change and what moved first are there, for the page to draw."""

from __future__ import annotations

from rlmon.service.metrics import remedies
from rlmon.service.service_core import ServiceCore
from tests.support.web_support import get

RUN = "grpo-demo-0"


def test_an_escalated_warning_reads_critical_with_its_level_and_step(
        service: ServiceCore) -> None:
    for step in (7, 14):  # the warning's firing and its escalation: the same incident
        status, a, _ = get(service, f"/api/alert?run={RUN}&role=actor&alert=LogprobMismatch"
                                    f"&step={step}")
        assert status == 200
        assert (a["onset"], a["first_severity"], a["severity"]) == (7, "warning", "critical")
        assert a["escalated_at"] == 14 and a["escalated_value"] > 0.3
        assert a["critical_condition"] == "actor/logp_diff > 0.3 (the critical level)"
    status, latest, _ = get(service, f"/api/alert?run={RUN}&role=actor&alert=LogprobMismatch")
    assert status == 200 and latest["onset"] == 7 and latest["severity"] == "critical"


def test_the_alert_carries_its_cost_what_to_change_and_what_moved_first(
        service: ServiceCore) -> None:
    _, a, _ = get(service, f"/api/alert?run={RUN}&role=actor&alert=ISRatioStale")
    assert a["severity"] == a["first_severity"] == "warning" and a["escalated_at"] is None
    assert a["cost"]["gpu_hours"] is not None and a["cost"]["gpu_hours"] > 0
    assert a["cost"]["note"].startswith("firing for")
    assert a["what_to_change"] == remedies.remedy_text("ISRatioStale", a["framework"])
    assert a["what_to_change"]
    # what moved first, as the service's notification said it at the firing
    sent = [e for e in service.history.alerts(RUN) if e["alert"] == "ISRatioStale"]
    assert sent and isinstance(a["first_moved"], str)
    assert a["first_moved"] == "" or a["first_moved"].startswith("`")
