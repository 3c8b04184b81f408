"""Conditions about a step's shape rather than a level: a value that is not finite, a value
outside its physical domain, a step finalized without every rank, replicated copies that
disagree. They judge events, not a level, and on a log's records (complete, one copy) the last
two never hold. Prometheus reads the exporter's per-step counts of the same things, so both paths
agree on what counts as bad.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from rlmon.service.alerting import rank_missing
from rlmon.service.alerting.alert_types import AlertState
from rlmon.service.alerting.conditions.kind import (
    ANY_METRIC,
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
    check_every,
    counted,
    metric_names,
)
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.export import series
from rlmon.service.metrics import catalog
from rlmon.service.metrics.spec import Domain

__all__ = ["NonFinite", "OutOfDomain", "RankMissing", "ReplicaMismatch"]


class NonFinite(ConditionKind):
    condition = Condition.NON_FINITE

    def check(self, rule: RuleLike, record: StepRecord, state: AlertState) -> Check:
        metrics = record.metrics
        if rule.metric != ANY_METRIC and rule.metric not in metrics:
            return NOT_APPLICABLE
        bad = [n for n in check_every(rule, metrics) if not math.isfinite(metrics[n])]
        return Check(True, bool(bad), bad[0] if bad else "", metrics[bad[0]] if bad else None)

    def quiet(self, rule: RuleLike, state: AlertState, columns: Columns) -> Advance:
        if rule.metric == ANY_METRIC:
            bad = columns.never.copy()
            for name in columns.names:
                values, present = columns.column(name)
                bad |= present & ~np.isfinite(values)
            return counted(columns.every, bad)
        values, present = columns.column(rule.metric)
        return counted(present, present & ~np.isfinite(values))

    def promql(self, rule: RuleLike) -> Export:
        if rule.metric != ANY_METRIC:
            return RlmonOnly.NO_SERIES  # the exporter counts per (run, role), not per metric
        return PromQL(series.NONFINITE_METRICS.name + " > 0",
                      "the exporter counts NaN/Inf values of the latest step per (run, role)")

    def describe(self, rule: RuleLike) -> str:
        return "a metric is NaN or Inf" if rule.metric == ANY_METRIC else f"{rule.metric} NaN/Inf"


def _inside(domain: Domain, value: Any) -> Any:
    """``Domain.contains`` for a float and for a column alike (finite values)."""
    if domain is Domain.NONNEGATIVE:
        return value >= 0.0
    if domain is Domain.FRACTION:
        return (value >= 0.0) & (value <= 1.0)
    return np.isfinite(value)  # any finite value


class OutOfDomain(ConditionKind):
    condition = Condition.OUT_OF_DOMAIN

    def check(self, rule: RuleLike, record: StepRecord, state: AlertState) -> Check:
        metrics = record.metrics
        for name in check_every(rule, metrics):
            spec = catalog.lookup(name)
            value = metrics.get(name)
            if spec is None or value is None or not math.isfinite(value):
                continue
            if not _inside(spec.domain, value):
                return Check(True, True, name, value)
        return Check(True, False)

    def quiet(self, rule: RuleLike, state: AlertState, columns: Columns) -> Advance:
        bad = columns.never.copy()
        for name in metric_names(columns, rule):
            spec = catalog.lookup(name)
            if spec is not None:
                values, finite = columns.finite(name)
                with np.errstate(invalid="ignore"):
                    bad |= finite & ~_inside(spec.domain, values)
        return counted(columns.every, bad)

    def promql(self, rule: RuleLike) -> Export:
        if rule.metric != ANY_METRIC:
            return RlmonOnly.NO_SERIES
        return PromQL(series.OUT_OF_DOMAIN_METRICS.name + " > 0",
                      "the exporter counts values outside the catalog's domains")

    def describe(self, rule: RuleLike) -> str:
        return "a value outside its physical domain"


class RankMissing(ConditionKind):
    condition = Condition.RANK_MISSING

    def check(self, rule: RuleLike, record: StepRecord, state: AlertState) -> Check:
        return Check(True, not record.complete, "ranks_reporting", float(record.ranks_reporting),
                     "" if record.complete else rank_missing.detail(record))

    def quiet(self, rule: RuleLike, state: AlertState, columns: Columns) -> Advance:
        return counted(columns.every, columns.never)  # a log's records are complete

    def promql(self, rule: RuleLike) -> Export:
        return PromQL(series.STEP_COMPLETE.name + " == 0")

    def describe(self, rule: RuleLike) -> str:
        return "a step finalized without every expected rank"


class ReplicaMismatch(ConditionKind):
    condition = Condition.REPLICA_MISMATCH

    def check(self, rule: RuleLike, record: StepRecord, state: AlertState) -> Check:
        names = [n for n in record.replica_mismatches if rule.metric in (ANY_METRIC, n)]
        first = names[0] if names else rule.metric
        return Check(True, bool(names), first if first != ANY_METRIC else "",
                     record.metrics.get(first))

    def quiet(self, rule: RuleLike, state: AlertState, columns: Columns) -> Advance:
        return counted(columns.every, columns.never)  # a log's records hold one copy

    def promql(self, rule: RuleLike) -> Export:
        return PromQL(series.REPLICA_MISMATCHES.name + " > 0")

    def describe(self, rule: RuleLike) -> str:
        return "replicated copies disagree"
