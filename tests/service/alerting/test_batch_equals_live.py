"""The engine's batch path (``evaluate_sorted``: a long batch's baseline predictions computed at
once, per-rule parameters built once) raises exactly the events of its live path (``evaluate``,
one finalized step at a time, as the service feeds it) on the GRPO workload's runs, healthy and
with each fault: same alerts, same steps, same values, same final states."""

from __future__ import annotations

import numpy as np
import pytest

from rlmon.service.aggregation.assembly import StepAssembler
from rlmon.service.alerting import baseline_batch
from rlmon.service.alerting.engine import AlertEngine, AlertEvent, evaluate_in_order
from rlmon.service.alerting.quiet_steps import evaluate_quietly
from rlmon.service.alerting.rules import Rule, default_rules
from rlmon.service.contract.records import parse_report
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.diagnose.columns import ColumnRows, RecordView, RowsBuilder
from rlmon.service.metrics import catalog as c
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


# --- a long log evaluated only where something can happen (quiet_steps) ----------------------

def _log(seed: int, steps: int) -> RecordView:
    """A generated log (seeded): noisy healthy metrics with, at random places, spikes over a
    threshold in the middle of long quiet stretches, sustained faults long enough to escalate,
    recoveries that hover near the threshold (hysteresis), ramps past a critical level
    (escalation), slow drifts for the baseline
    detectors, NaN and Inf values, and metrics missing at some steps."""
    rng = np.random.default_rng(seed)
    n = steps
    metrics = {
        c.ENTROPY: 0.5 + 0.02 * rng.standard_normal(n),
        c.KL: np.abs(0.05 + 0.01 * rng.standard_normal(n)),
        c.GRAD_NORM: np.abs(1.0 + 0.1 * rng.standard_normal(n)),
        c.REWARD: 0.3 + 0.05 * rng.standard_normal(n),
        c.RESPONSE_LENGTH: 200 + 10 * rng.standard_normal(n),
        c.CLIP_RATIO: np.abs(0.05 + 0.01 * rng.standard_normal(n)),
    }
    names = list(metrics)
    for _ in range(int(rng.integers(8, 16))):
        name = names[int(rng.integers(len(names)))]
        start = int(rng.integers(0, n))
        length = int(rng.choice([1, 2, 3, 5, 25, 150, 400]))
        column = metrics[name]
        kind = int(rng.integers(6))
        end = min(n, start + length)
        if kind == 0:  # far over every threshold (critical levels included)
            column[start:end] = 5000.0 if name != c.ENTROPY else 1e-4
        elif kind == 1:  # just over, hovering: fires, then each good step counts
            column[start:end] = {c.ENTROPY: 0.009, c.KL: 2.5, c.GRAD_NORM: 11.0,
                                 c.REWARD: 0.0, c.RESPONSE_LENGTH: 2000.0,
                                 c.CLIP_RATIO: 0.35}[name] * rng.choice([0.98, 1.02], end - start)
        elif kind == 2:  # a slow drift away (the baseline rules' case)
            column[start:end] = column[start:end] * np.linspace(1.0, 3.0, end - start)
        elif kind == 3:
            column[start:end] = rng.choice([np.nan, np.inf, -1.0], end - start)
        elif kind == 4:
            column[start:end] = 0.0  # a stuck value
        else:  # over the warning level, then past the critical one: an escalation
            column[start:end] = np.linspace(1.1, 30.0, end - start) * {
                c.ENTROPY: 2.0, c.KL: 2.0, c.GRAD_NORM: 10.0, c.REWARD: 1.0,
                c.RESPONSE_LENGTH: 1000.0, c.CLIP_RATIO: 0.3}[name]
    builder = RowsBuilder()
    missing = {name: rng.random(n) < 0.02 for name in names}
    for i in range(n):
        builder.add(i + 1, {name: float(metrics[name][i]) for name in names
                            if not missing[name][i]})
    rows = builder.build()
    assert isinstance(rows, ColumnRows)
    return RecordView(rows, {name: name for name in names}, "log", "trainer")


@pytest.mark.parametrize("seed", range(8))
def test_quiet_steps_raise_the_live_paths_events(seed: int,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(baseline_batch, "MIN_SERIES", 300)  # the baseline's batch path too
    records = _log(seed, 2_500)
    rules = default_rules()
    live = AlertEngine(rules)
    live_events = [(i, e) for i, record in enumerate(records)
                   for e in live.evaluate(record)]
    quiet = AlertEngine(rules)
    judged = 0
    evaluate_rules = quiet.evaluate_rules

    def counted(record: StepRecord, some: list[Rule]) -> list[AlertEvent]:
        nonlocal judged
        judged += len(some)
        return evaluate_rules(record, some)

    monkeypatch.setattr(quiet, "evaluate_rules", counted)
    quiet_events = [(i, e) for i, events in evaluate_quietly(quiet, records) for e in events]
    assert judged < len(rules) * len(records) / 4, "the quiet steps were not skipped"
    assert any(s.ahead is not None for s in quiet.states.values()), "no batch predictions"
    assert repr(quiet_events) == repr(live_events)  # NaN values: equal as written
    assert repr(quiet.states) == repr(live.states)
    assert quiet.last_step == live.last_step
    assert {e.state for _, e in live_events} == {"firing", "resolved"}, "nothing to compare"
