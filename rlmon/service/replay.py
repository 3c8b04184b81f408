"""Replay a partial-report file (docs/contract.md) into steps and alerts, offline.

Records are folded in arrival order; steps complete as their last expected rank reports, and the
rest finalize at end of input. Alerts are then evaluated per (run, role) in increasing step order.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from rlmon.service.aggregation.assembly import AssemblyCounters, StepAssembler
from rlmon.service.alerting.engine import AlertEngine, AlertEvent, evaluate_in_order
from rlmon.service.alerting.rules import Rule, default_rules
from rlmon.service.contract.records import ContractError, parse_line
from rlmon.service.contract.step_record import StepRecord

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


def replay(lines: Iterable[str | bytes], rules: Sequence[Rule] | None = None) -> ReplayResult:
    """Assemble every record of ``lines`` and evaluate ``rules`` (the default pack if None)."""
    assembler = StepAssembler()
    result = ReplayResult(counters=assembler.counters)
    records: list[StepRecord] = []
    for number, raw in enumerate(lines, start=1):
        result.lines = number
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
    result.steps = evaluate_in_order(engine, records)
    return result
