"""``rlmon demo``'s closing table says how each alert transition ended: an escalation is not a
second firing, and a closing that is no recovery (the run ended with the alert firing, or its
level rule took it over) is not "resolved"."""

from __future__ import annotations

from typing import Any

import pytest

from rlmon.commands.demo import _summary


def _alert(step: int, alert: str, severity: str, state: str, **closing: Any) -> dict[str, Any]:
    return {"type": "alert", "run": "r", "role": "actor", "step": step, "alert": alert,
            "severity": severity, "state": state, "metric": "actor/logp_diff", "value": 0.2,
            "ended_with_run": 0, "handed_to": "", **closing}


def test_the_table_names_escalations_and_closings_that_are_no_recovery(
        capsys: pytest.CaptureFixture[str]) -> None:
    steps = [{"step": s, "role": "actor", "ranks_reporting": 4, "ranks_expected": 4,
              "metrics": {"actor/entropy": 0.3}} for s in range(30)]
    alerts = [_alert(7, "LogprobMismatch", "warning", "firing"),
              _alert(14, "LogprobMismatch", "critical", "firing"),
              _alert(20, "EntropySliding", "warning", "firing"),
              _alert(22, "EntropySliding", "warning", "resolved", handed_to="EntropyCollapse"),
              _alert(22, "EntropyCollapse", "critical", "firing"),
              _alert(25, "ClipRatioHigh", "warning", "firing"),
              _alert(27, "ClipRatioHigh", "warning", "resolved"),
              _alert(29, "LogprobMismatch", "critical", "resolved", ended_with_run=1)]
    _summary(steps, alerts, "demo.png", None, 1.0)
    out = " ".join(capsys.readouterr().out.split())  # the table's cells wrap
    assert "LogprobMismatch firing" in out and "LogprobMismatch escalated to critical" in out
    assert "EntropySliding handed over to EntropyCollapse" in out
    assert "LogprobMismatch firing when the run ended" in out
    assert "ClipRatioHigh resolved" in out  # a recovery is still called one
    assert out.count("resolved") == 1, out
