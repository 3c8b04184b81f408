"""Replay a partial-report file (docs/contract.md) into steps and alerts, offline.

Records are folded in arrival order; steps complete as their last expected rank reports, and the
rest finalize at end of input. Alerts are then evaluated per (run, role) in increasing step order;
the time-based ones (a stall, a step-time regression) from the records' ``time`` fields.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from rlmon.service.aggregation.assembly import AssemblyCounters, StepAssembler
from rlmon.service.alerting.engine import AlertEngine, AlertEvent, evaluate_in_order
from rlmon.service.alerting.liveness_alerts import liveness_events
from rlmon.service.alerting.rules import Rule, default_rules
from rlmon.service.contract.records import ContractError, parse_line
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.input_files import LineTooLong
from rlmon.service.liveness.run_state import LivenessTracker
from rlmon.service.liveness.thresholds import LivenessParams

__all__ = ["LineError", "ReplayResult", "replay"]


@dataclass(frozen=True, slots=True)
class LineError:
    line: int
    error: str

    def to_json(self) -> dict[str, object]:
        return {"type": "error", "line": self.line, "error": self.error}


@dataclass(slots=True)
class ReplayResult:
    steps: list[tuple[StepRecord, list[AlertEvent]]] = field(default_factory=list)
    errors: list[LineError] = field(default_factory=list)
    lines: int = 0
    counters: AssemblyCounters = field(default_factory=AssemblyCounters)

    @property
    def alerts(self) -> list[AlertEvent]:
        return [event for _, events in self.steps for event in events]

    @property
    def exit_code(self) -> int:
        return 2 if self.errors else 0

    def summary(self) -> dict[str, object]:
        c = self.counters
        return {
            "type": "summary",
            "lines": self.lines,
            "accepted": c.accepted,
            "rejected": len(self.errors),
            "duplicates": c.duplicates,
            "late": c.late,
            "steps": len(self.steps),
            "incomplete_steps": c.steps_incomplete,
            "alerts": len(self.alerts),
        }


def replay(lines: Iterable[str | bytes | LineTooLong], rules: Sequence[Rule] | None = None,
           liveness: LivenessParams | None = None) -> ReplayResult:
    """Assemble every record of ``lines`` and evaluate ``rules`` (the default pack if None)."""
    assembler = StepAssembler()
    result = ReplayResult(counters=assembler.counters)
    records: list[StepRecord] = []
    for number, raw in enumerate(lines, start=1):
        result.lines = number
        if isinstance(raw, LineTooLong):  # skipped unread by the bounded reader
            result.errors.append(LineError(number, str(raw)))
            continue
        if isinstance(raw, bytes):
            try:
                raw = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                result.errors.append(LineError(number, f"not UTF-8 at byte {exc.start}"))
                assembler.counters.rejected += 1
                continue
        if not raw.strip():
            continue
        try:
            report = parse_line(raw)
            _, record = assembler.add(report)
        except ContractError as exc:
            result.errors.append(LineError(number, str(exc)))
            continue
        if record is not None:
            records.append(record)
    records.extend(assembler.finalize_all())
    assembler.counters.rejected = len(result.errors)
    engine = AlertEngine(default_rules() if rules is None else rules)
    result.steps = with_time_based(engine, evaluate_in_order(engine, records), liveness)
    return result


def with_time_based(
    engine: AlertEngine, steps: list[tuple[StepRecord, list[AlertEvent]]],
    params: LivenessParams | None = None,
) -> list[tuple[StepRecord, list[AlertEvent]]]:
    """Add the time-based alerts the records' ``time`` fields show (docs/liveness.md): a gap
    between two steps longer than the stall threshold is RunStalled, fired at the step before
    the gap and resolved at the step after it; steps far slower than the run's baseline are
    StepTimeRegression. Heartbeats are not recorded, so RunDied and StageStuck cannot be
    replayed, nor can anything after the last record (the file ends there, the run may not)."""
    trackers: dict[tuple[str, str], LivenessTracker] = {}  # one per stream: its own clock
    out: list[tuple[StepRecord, list[AlertEvent]]] = []
    last: dict[tuple[str, str], int] = {}  # stream -> index in out of its latest step
    for record, events in steps:
        stream = (record.run, record.role)
        at = record.time
        if at is None or record.attempt != engine.attempts.get(stream, record.attempt):
            out.append((record, events))
            continue
        tracker = trackers.setdefault(stream, LivenessTracker(params))
        view = tracker.view(*stream, at)
        if view is not None and view.last_step_at is not None \
                and at - view.last_step_at > view.threshold:
            # the timer would have seen the stall once the threshold passed
            stalled_at = view.last_step_at + view.threshold + tracker.params.evaluate_seconds
            for v in tracker.evaluate(stalled_at):
                if stream in last:
                    out[last[stream]][1].extend(liveness_events(engine, v))
        tracker.finalized(record.run, record.role, record.step, at)
        extra = [e for v in tracker.evaluate(at) for e in liveness_events(engine, v)]
        last[stream] = len(out)
        out.append((record, [*events, *extra]))
    return out
