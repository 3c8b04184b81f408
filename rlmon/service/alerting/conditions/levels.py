"""A metric against fixed levels: ``threshold`` (value <op> threshold) and ``outside`` (value
below ``low`` or above ``high``).

Each comparison is written once, with operators that mean the same on a float and on a numpy
column, so the live check and the long-log mask are the same expression. While a rule fires, a
step counts as good only ``resolve_margin`` beyond the level (hysteresis); the batch half judges
idle rules only, which have no margin.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

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
    PromQL,
    RlmonOnly,
    RuleLike,
    counted,
    number,
    watched,
)
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.metrics import catalog

__all__ = ["OPS", "Outside", "Threshold"]

# value <op> threshold, for a float and for a column alike
OPS: dict[str, Callable[[Any, float], Any]] = {
    ">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le,
    "abs<": lambda value, threshold: abs(value) < threshold,
}
_GOOD_ABOVE = ("<", "<=", "abs<")  # ops whose good side is above the threshold


def _outside(value: Any, low: float, high: float) -> Any:
    """value < low or value > high, for a float and for a column alike."""
    return (value < low) | (value > high)


def _margin(rule: RuleLike, state: AlertState) -> float:
    """How far beyond the level a firing rule's step must be to count as good."""
    return rule.resolve_margin if state.firing and rule.resolve_margin else 0.0


def _family(rule: RuleLike) -> str | None:
    spec = catalog.lookup(rule.metric)
    return spec.prometheus_name if spec is not None else None  # a user metric has no family


class Threshold(ConditionKind):
    condition = Condition.THRESHOLD
    fields = ("op", "threshold")
    needs_metric = True

    def check(self, rule: RuleLike, record: StepRecord, state: AlertState) -> Check:
        value = watched(rule, record)
        if value is None:
            return NOT_APPLICABLE
        assert rule.op is not None and rule.threshold is not None
        margin = _margin(rule, state)
        bound = rule.threshold + (margin if rule.op in _GOOD_ABOVE else -margin)
        return Check(True, bool(OPS[rule.op](value, bound)), rule.metric, value)

    def quiet(self, rule: RuleLike, state: AlertState, columns: Columns) -> Advance:
        values, applies = columns.finite(rule.metric)
        assert rule.op is not None and rule.threshold is not None
        with np.errstate(invalid="ignore"):
            holds = OPS[rule.op](values, rule.threshold)
        return counted(applies, applies & holds)

    def promql(self, rule: RuleLike) -> Export:
        name = _family(rule)
        if name is None:
            return RlmonOnly.NO_SERIES  # it lives in rlmon_custom_metric, no family of its own
        if rule.op == "abs<":
            return PromQL(f"abs({name}) < {number(rule.threshold)}", quotes_value=True)
        return PromQL(f"{name} {rule.op} {number(rule.threshold)}", quotes_value=True)

    def describe(self, rule: RuleLike) -> str:
        assert rule.threshold is not None
        if rule.op == "abs<":
            return f"abs({rule.metric}) < {rule.threshold:g}"
        return f"{rule.metric} {rule.op} {rule.threshold:g}"

    def validate(self, rule: RuleLike) -> None:
        if rule.op is None or rule.threshold is None:
            raise ValueError("condition 'threshold' needs 'op' and 'threshold'")


class Outside(ConditionKind):
    condition = Condition.OUTSIDE
    fields = ("low", "high")
    needs_metric = True

    def check(self, rule: RuleLike, record: StepRecord, state: AlertState) -> Check:
        value = watched(rule, record)
        if value is None:
            return NOT_APPLICABLE
        assert rule.low is not None and rule.high is not None
        margin = _margin(rule, state)
        return Check(True, bool(_outside(value, rule.low + margin, rule.high - margin)),
                     rule.metric, value)

    def quiet(self, rule: RuleLike, state: AlertState, columns: Columns) -> Advance:
        values, applies = columns.finite(rule.metric)
        assert rule.low is not None and rule.high is not None
        with np.errstate(invalid="ignore"):
            holds = _outside(values, rule.low, rule.high)
        return counted(applies, applies & holds)

    def promql(self, rule: RuleLike) -> Export:
        name = _family(rule)
        if name is None:
            return RlmonOnly.NO_SERIES
        return PromQL(f"{name} < {number(rule.low)} or {name} > {number(rule.high)}",
                      quotes_value=True)

    def describe(self, rule: RuleLike) -> str:
        assert rule.low is not None and rule.high is not None
        return f"{rule.metric} outside [{rule.low:g}, {rule.high:g}]"

    def validate(self, rule: RuleLike) -> None:
        if rule.low is None or rule.high is None:
            raise ValueError("condition 'outside' needs 'low' and 'high'")
        if rule.low > rule.high:
            raise ValueError(f"'low' ({rule.low}) is above 'high' ({rule.high})")
