"""A metric's last ``window`` judged values: ``stuck`` (unchanged within ``tolerance``) and
``trend`` (strictly monotone in ``direction``).

The state's history holds the last ``window`` finite values the rule saw, oldest first; the
condition is judged once it is full. In a long log that history is, at every step, the window of
the column's finite values just before it, so the batch half judges every window at once (the
same comparisons on the same floats: max and min are exact in any order) and hands the engine
the history it would have built.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import ClassVar

import numpy as np

from rlmon.service.alerting.alert_types import AlertState
from rlmon.service.alerting.conditions.kind import (
    NOT_APPLICABLE,
    Advance,
    Check,
    Columns,
    Condition,
    ConditionKind,
    Export,
    RlmonOnly,
    RuleLike,
    watched,
)
from rlmon.service.contract.step_record import StepRecord

__all__ = ["Stuck", "Trend"]


def _remember(rule: RuleLike, state: AlertState, value: float) -> list[float] | None:
    """Append ``value`` to the rule's window; the full window (oldest first), or None while it
    is still filling."""
    window = rule.window or 2
    state.history.append(value)
    while len(state.history) > window:
        state.history.popleft()
    return list(state.history) if len(state.history) == window else None


def _running(reduce: Callable[[np.ndarray, np.ndarray], np.ndarray], values: np.ndarray,
             width: int) -> np.ndarray:
    """``reduce`` (np.maximum, np.minimum) over each run of ``width`` consecutive values
    (len(values) - width + 1 of them), in O(n log width): two overlapping power-of-two blocks."""
    span, table = 1, values
    while 2 * span <= width:
        table = reduce(table[:-span], table[span:])
        span *= 2
    count = len(values) - width + 1
    return reduce(table[:count], table[width - span:width - span + count])


class _WindowKind(ConditionKind):
    fields: ClassVar[tuple[str, ...]] = ("window",)
    needs_metric = True

    def holds(self, rule: RuleLike, values: list[float]) -> bool:
        raise NotImplementedError

    def windows(self, rule: RuleLike, series: np.ndarray, window: int) -> np.ndarray:
        """Per full window of ``series`` (ending at index window - 1, window, ...), whether the
        condition holds: :meth:`holds` for every window at once."""
        raise NotImplementedError

    def check(self, rule: RuleLike, record: StepRecord, state: AlertState) -> Check:
        value = watched(rule, record)
        if value is None:
            return NOT_APPLICABLE
        full = _remember(rule, state, value)
        return Check(True, full is not None and self.holds(rule, full), rule.metric, value)

    def quiet(self, rule: RuleLike, state: AlertState, columns: Columns) -> Advance:
        window = rule.window or 2
        values, applies = columns.finite(rule.metric)
        where = np.flatnonzero(applies)
        series = values[where]
        holds = np.zeros(columns.size, dtype=bool)
        if len(series) >= window:
            holds[where[window - 1:]] = self.windows(rule, series, window)
        seen = np.concatenate(([0], np.cumsum(applies)))  # finite values before each step

        def advance(state: AlertState, start: int) -> int:
            found = np.flatnonzero(holds[start:])
            stop = start + int(found[0]) if found.size else columns.size
            count = int(seen[stop] - seen[start])
            if count:
                state.false_steps += count
                state.true_steps = 0
                state.history.clear()
                state.history.extend(series[max(0, seen[stop] - window):seen[stop]].tolist())
            return stop
        return advance

    def promql(self, rule: RuleLike) -> Export:
        return RlmonOnly.STEP_HISTORY

    def validate(self, rule: RuleLike) -> None:
        if rule.window is None:
            raise ValueError(f"condition {self.condition.value!r} needs 'window' (>= 2 steps)")


class Stuck(_WindowKind):
    condition = Condition.STUCK

    def holds(self, rule: RuleLike, values: list[float]) -> bool:
        return max(values) - min(values) <= rule.tolerance

    def windows(self, rule: RuleLike, series: np.ndarray, window: int) -> np.ndarray:
        spread = _running(np.maximum, series, window) - _running(np.minimum, series, window)
        return spread <= rule.tolerance

    def describe(self, rule: RuleLike) -> str:
        return f"{rule.metric} unchanged for {rule.window} steps"


class Trend(_WindowKind):
    condition = Condition.TREND
    fields = ("window", "direction")

    def holds(self, rule: RuleLike, values: list[float]) -> bool:
        pairs = list(itertools.pairwise(values))
        if rule.direction == "up":
            return all(b > a for a, b in pairs)
        return all(b < a for a, b in pairs)

    def windows(self, rule: RuleLike, series: np.ndarray, window: int) -> np.ndarray:
        moved = series[1:] > series[:-1] if rule.direction == "up" else series[1:] < series[:-1]
        # pairs that did not move the watched way, before each pair: a window of window - 1
        # pairs holds when it has none
        against = np.concatenate(([0], np.cumsum(~moved)))
        return against[window - 1:] - against[:len(against) - window + 1] == 0

    def describe(self, rule: RuleLike) -> str:
        return f"{rule.metric} trending {rule.direction} for {rule.window} steps"

    def validate(self, rule: RuleLike) -> None:
        super().validate(rule)
        if rule.direction is None:
            raise ValueError("condition 'trend' needs 'direction' (up or down)")
