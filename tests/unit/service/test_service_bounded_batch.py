"""A published batch with more streams than the service keeps in memory loses nothing: every
step and every alert state reaches the history store (issue 23, defect c, the service's side)."""

from __future__ import annotations

from pathlib import Path

from rlmon.service.config import Settings
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.metrics import catalog
from rlmon.service.service_core import ServiceCore


def test_a_batch_over_max_streams_keeps_every_step_and_alert_state(tmp_path: Path) -> None:
    settings = Settings.model_validate({"notifiers": {"console": {"enabled": False}},
                                        "retention": {"max_streams": 100}})
    core = ServiceCore(settings, state_dir=tmp_path)
    try:
        records = [StepRecord(f"run-{i}", "actor", 0, True, 1, 1, (), {catalog.IS_RATIO: 3.0})
                   for i in range(201)]
        events = core.publish(records)
        assert len([e for e in events if e.alert == "ISRatioDivergence"]) == 201
        assert len(core.history.steps()) == 201
        firing = {a["run"] for a in core.history.firing_alerts()
                  if a["alert"] == "ISRatioDivergence"}
        assert len(firing) == 201
    finally:
        core.close(0.0)
