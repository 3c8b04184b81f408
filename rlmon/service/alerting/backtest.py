"""Backtest a rule pack on a recorded run: per rule, the steps it would have fired and resolved.

``rlmon replay FILE --rules RULES`` prints this after the replay, so users tune thresholds and
early-warning parameters on their own history before enabling a rule. The episodes come from the
same engine the service runs, so what the backtest shows is what the service would have sent.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rlmon.service.alerting.alert_types import AlertEvent
from rlmon.service.alerting.rules import Rule
from rlmon.service.contract.step_record import StepRecord

__all__ = ["Episode", "RuleBacktest", "backtest"]


@dataclass(frozen=True, slots=True)
class Episode:
    """One incident: fired at ``fired``, resolved at ``resolved`` (None: still firing at the end)."""

    fired: int
    resolved: int | None


@dataclass(frozen=True, slots=True)
class RuleBacktest:
    """What one rule did on one (run, role); ``run`` is None for a rule that never fired."""

    rule: str
    severity: str
    condition: str
    run: str | None
    role: str | None
    episodes: tuple[Episode, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "type": "backtest", "rule": self.rule, "severity": self.severity,
            "condition": self.condition, "run": self.run, "role": self.role,
            "fired": [[e.fired, e.resolved] for e in self.episodes],
        }


def backtest(
    rules: Sequence[Rule], steps: Sequence[tuple[StepRecord, Sequence[AlertEvent]]],
) -> list[RuleBacktest]:
    """Per rule (in pack order) and (run, role) it fired on, its episodes; one entry with no
    episodes for a rule that never fired."""
    open_at: dict[tuple[str, str, str], int] = {}
    episodes: dict[tuple[str, str, str], list[Episode]] = {}
    for _, events in steps:
        for event in events:
            key = (event.alert, event.run, event.role)
            if event.state == "firing":
                open_at[key] = event.step
            elif key in open_at:
                episodes.setdefault(key, []).append(Episode(open_at.pop(key), event.step))
    for key, fired in open_at.items():
        episodes.setdefault(key, []).append(Episode(fired, None))
    out = []
    for rule in rules:
        mine = sorted((k, v) for k, v in episodes.items() if k[0] == rule.name)
        if not mine:
            out.append(RuleBacktest(rule.name, rule.severity.value, rule.describe(), None, None,
                                    ()))
        for (_, run, role), found in mine:
            ordered = tuple(sorted(found, key=lambda e: e.fired))
            out.append(RuleBacktest(rule.name, rule.severity.value, rule.describe(), run, role,
                                    ordered))
    return out
