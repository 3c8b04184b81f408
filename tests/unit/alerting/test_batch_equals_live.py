"""The engine's batch path (``evaluate_sorted``: a long batch's baseline predictions computed at
once, per-rule parameters built once) raises exactly the events of its live path (``evaluate``,
one finalized step at a time, as the service feeds it) on the GRPO workload's runs, healthy and
with each fault: same alerts, same steps, same values, same final states."""

from __future__ import annotations

import pytest

from rlmon.service.aggregation.assembly import StepAssembler
from rlmon.service.alerting import baseline_batch
from rlmon.service.alerting.engine import AlertEngine, evaluate_in_order
from rlmon.service.alerting.rules import default_rules
from rlmon.service.contract.records import parse_report
from rlmon.service.contract.step_record import StepRecord
from rlmon.workload.grpo import FAULTS, simulate


def _records(fault: str) -> list[StepRecord]:
    assembler = StepAssembler()
    records = []
    for raw in simulate(steps=120, dp=2, cp=1, fault_step=None if fault == "none" else 60,
                        run=f"grpo-{fault}", fault=fault):
        _, record = assembler.add(parse_report(raw))
        if record is not None:
            records.append(record)
    return records + assembler.finalize_all()


@pytest.mark.parametrize("fault", FAULTS)
def test_batch_path_raises_the_live_paths_events(fault: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # short series still take the batch predictions, in many uneven blocks
    monkeypatch.setattr(baseline_batch, "MIN_SERIES", 100)
    monkeypatch.setattr(baseline_batch, "_BLOCK", 37)
    records = _records(fault)
    live = AlertEngine(default_rules())
    live_events = [event for record in sorted(records, key=lambda r: r.identity)
                   for event in live.evaluate(record)]
    batch = AlertEngine(default_rules())
    batch_events = [event for _, events in evaluate_in_order(batch, records) for event in events]
    assert any(s.ahead is not None for s in batch.states.values()), "no batch predictions"
    assert batch_events == live_events
    assert batch.states == live.states
    if fault != "none":
        assert live_events, f"{fault}: the workload's fault raised no alert"
