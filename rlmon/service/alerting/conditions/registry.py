"""The registry: one :class:`~rlmon.service.alerting.conditions.kind.ConditionKind` per
:class:`~rlmon.service.alerting.conditions.kind.Condition`, complete (a condition without a kind
fails at import, not at the first step that meets it)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from rlmon.service.alerting.conditions.drift import Drift
from rlmon.service.alerting.conditions.hacking import RewardHacking
from rlmon.service.alerting.conditions.kind import Condition, ConditionKind, RuleLike
from rlmon.service.alerting.conditions.levels import Outside, Threshold
from rlmon.service.alerting.conditions.liveness import TIMED_KINDS, TimedKind
from rlmon.service.alerting.conditions.straggler import StragglerRank
from rlmon.service.alerting.conditions.structural import (
    NonFinite,
    OutOfDomain,
    RankMissing,
    ReplicaMismatch,
)
from rlmon.service.alerting.conditions.windows import Stuck, Trend

__all__ = ["CONDITIONS", "LIVENESS_CONDITIONS", "TIMED", "kind_of"]

_KINDS: tuple[ConditionKind, ...] = (
    Threshold(), Outside(), NonFinite(), OutOfDomain(), Stuck(), Trend(), RankMissing(),
    ReplicaMismatch(), Drift(), StragglerRank(), RewardHacking(), *TIMED_KINDS)

CONDITIONS: Mapping[Condition, ConditionKind] = MappingProxyType(
    {kind.condition: kind for kind in _KINDS})
_missing = sorted(set(Condition) - set(CONDITIONS))
if _missing or len(CONDITIONS) != len(_KINDS):
    raise RuntimeError(f"conditions without exactly one kind: {_missing or 'a duplicate'}")

# the kinds judged on the liveness timer, by condition
TIMED: Mapping[Condition, TimedKind] = MappingProxyType(
    {kind.condition: kind for kind in TIMED_KINDS})
LIVENESS_CONDITIONS = frozenset(TIMED)


def kind_of(rule: RuleLike) -> ConditionKind:
    return CONDITIONS[rule.condition]
