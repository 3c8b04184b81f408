"""``straggler_rank``: the same rank the step's slowest, by more than ``threshold`` x the median
rank's step time (:mod:`rlmon.service.contract.timeline`). Only steps whose ranks sent timelines
are judged; a log's records have none.
"""

from __future__ import annotations

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
    never_judged,
)
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.metrics import catalog

__all__ = ["StragglerRank"]

_RANK_KEY_MASK = 2**53 - 1  # a rank's key kept in AlertState.history: exact in a float


class StragglerRank(ConditionKind):
    condition = Condition.STRAGGLER_RANK
    fields = ("threshold",)

    def check(self, rule: RuleLike, record: StepRecord, state: AlertState) -> Check:
        """The step's slowest rank over the threshold, and the same rank as the steps before
        (another rank starts the count over); the rank is remembered in ``state.history``."""
        found = record.straggler
        if found is None:
            return NOT_APPLICABLE  # fewer than two ranks sent a timeline
        assert rule.threshold is not None
        holds = found.ratio > rule.threshold
        key = float(hash(tuple(found.rank)) & _RANK_KEY_MASK)  # ints hash alike in every process
        if holds and state.history and state.history[-1] != key:
            state.true_steps = 0
        state.history.clear()
        if holds:
            state.history.append(key)
        return Check(True, holds, catalog.STRAGGLER_METRIC, found.ratio,
                     found.describe() if holds else "")

    def quiet(self, rule: RuleLike, state: AlertState, columns: Columns) -> Advance:
        return never_judged(columns)

    def promql(self, rule: RuleLike) -> Export:
        return RlmonOnly.TIMELINES

    def describe(self, rule: RuleLike) -> str:
        assert rule.threshold is not None
        return f"the same rank slowest, over {rule.threshold:g}x the median rank's step time"

    def validate(self, rule: RuleLike) -> None:
        if rule.threshold is None or rule.threshold < 1:
            raise ValueError("condition 'straggler_rank' needs 'threshold' (a factor >= 1)")
