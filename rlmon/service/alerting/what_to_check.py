"""What an alert's reader should look at first: chosen here, once, for every alert.

Every place that words an alert asks :func:`what_to_check`: the engine's events (and through them
the notifications, the console and ``diagnose``), the liveness alerts, the Prometheus rules'
descriptions and the run page's alert (``/api/alert``). A condition that speaks for itself names
its own (RewardHacking: the completions and a held-out score; RankMissing: the missing ranks'
processes; the time-based alerts: their catalog entries, ``catalog.LIVENESS_ALERTS``); any other
alert names its metric's line in the catalog, and nothing for a metric outside it. What to
*change* is :func:`rlmon.service.metrics.remedies.remedy_text`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from rlmon.service.alerting import rank_missing, reward_hacking
from rlmon.service.alerting.conditions.kind import Condition
from rlmon.service.metrics import catalog

__all__ = ["what_to_check"]

_OWN: Mapping[Condition, str] = MappingProxyType({
    Condition.REWARD_HACKING: reward_hacking.WHAT_TO_CHECK,
    Condition.RANK_MISSING: rank_missing.WHAT_TO_CHECK,
    **{Condition(spec.condition): spec.what_to_check for spec in catalog.LIVENESS_ALERTS}})


def what_to_check(condition: Condition | None, metric: str) -> str:
    """The hint of an alert on ``condition`` (None: a rule the caller does not know) that fired
    on ``metric`` ("" or "*": none)."""
    own = _OWN.get(condition) if condition is not None else None
    if own is not None:
        return own
    spec = catalog.lookup(metric) if metric else None
    return spec.what_to_check if spec is not None else ""
