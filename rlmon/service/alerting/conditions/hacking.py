"""``reward_hacking``: reward, completion length and KL climbing together off the run's own course,
or the reward away from a verifier score (the detector is
:mod:`rlmon.service.alerting.reward_hacking`).

Judged where the reward is; the detector scores only a step with a reward and a length, and an
idle rule's score is below the decision, so in a long log a step without a length changes
nothing and is counted in bulk.
"""

from __future__ import annotations

import numpy as np

from rlmon.service.alerting import reward_hacking
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
    counted,
    watched,
)
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.metrics import catalog

__all__ = ["RewardHacking"]

_PARAMS: dict[int, tuple[RuleLike, reward_hacking.RewardHackingParams]] = {}


def _params(rule: RuleLike) -> reward_hacking.RewardHackingParams:
    """``rule.reward_hacking``, built once per rule, not at every step (a pydantic model's
    property rebuilt a million times is seconds of a long log); keyed by identity, the rule
    kept with it so its id is never reused."""
    cached = _PARAMS.get(id(rule))
    if cached is None or cached[0] is not rule:
        cached = _PARAMS[id(rule)] = (rule, rule.reward_hacking)
    return cached[1]


class RewardHacking(ConditionKind):
    condition = Condition.REWARD_HACKING
    fields = ("window", "allowance", "decision")
    needs_metric = True

    def check(self, rule: RuleLike, record: StepRecord, state: AlertState) -> Check:
        value = watched(rule, record)
        if value is None:
            return NOT_APPLICABLE
        hacking = _params(rule)
        state.score, found = reward_hacking.observe(hacking, state.history, state.score,
                                                    record.metrics, state.firing)
        return Check(True, state.score >= hacking.decision, rule.metric, value,
                     found.describe() if found is not None else "")

    def quiet(self, rule: RuleLike, state: AlertState, columns: Columns) -> Advance:
        _, applies = columns.finite(rule.metric)
        length, has_length = columns.finite(catalog.RESPONSE_LENGTH)
        with np.errstate(invalid="ignore"):
            judged = applies & has_length & (length > 0)
        return counted(applies, judged)

    def promql(self, rule: RuleLike) -> Export:
        return RlmonOnly.RUN_STATE

    def describe(self, rule: RuleLike) -> str:
        h = rule.reward_hacking
        return (f"{rule.metric} rising with rollout/response_length and actor/kl off their own "
                f"{h.window}-step course, or away from rollout/verifier_score "
                f"(CUSUM {h.allowance:g}/{h.decision:g} robust SDs)")
