"""What a condition kind is: the one place a rule condition's meaning is written.

Each :class:`Condition` has one :class:`ConditionKind` (the registry:
:mod:`rlmon.service.alerting.conditions.registry`) and everything that judges, skips, exports or
words a rule dispatches through it:

- :meth:`ConditionKind.check`: the live, scalar meaning, one finalized step at a time (the
  engine's :meth:`~rlmon.service.alerting.engine.AlertEngine.evaluate_rules`);
- :meth:`ConditionKind.quiet`: the same meaning over a long log's columns at once, the steps where
  the check cannot hold counted in bulk (:mod:`rlmon.service.alerting.quiet_steps`; None: judged
  at every step);
- :meth:`ConditionKind.promql`: the Prometheus alerting expression, or why rlmon alone can judge
  it (:mod:`rlmon.service.export.prometheus_rules`);
- :meth:`ConditionKind.describe`: the condition in words (notifications, ``rlmon rules``, the docs
  table of :mod:`rlmon.service.alerting.rules_doc`);
- for the kinds judged by time (:class:`TimedKind`): whether a liveness view makes it hold, its
  value and its onset (:mod:`rlmon.service.alerting.liveness_alerts`).

A kind's scalar and vector halves sit side by side, written with one predicate where numpy and
Python agree on it, and one tester runs over the registry
(``tests/unit/alerting/test_conditions.py``): the live and batch paths raise the same events for
every kind, and every rule has an expression or a reason.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import ClassVar, NamedTuple, Protocol

import numpy as np

from rlmon.service.alerting.alert_types import AlertState
from rlmon.service.alerting.reward_hacking import RewardHackingParams
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.metrics.spec import BaselineParams, Severity

__all__ = [
    "ANY_METRIC",
    "NOT_APPLICABLE",
    "Advance",
    "Check",
    "ColumnSource",
    "Columns",
    "Condition",
    "ConditionKind",
    "Export",
    "PromQL",
    "RlmonOnly",
    "RuleLike",
    "check_every",
    "counted",
    "metric_names",
    "never_judged",
    "number",
    "watched",
]

ANY_METRIC = "*"


class Condition(StrEnum):
    THRESHOLD = "threshold"  # value <op> threshold
    OUTSIDE = "outside"  # value < low or value > high
    NON_FINITE = "non_finite"  # NaN or Inf (metric "*" = any metric)
    OUT_OF_DOMAIN = "out_of_domain"  # outside the catalog's physical domain (metric "*" = any)
    STUCK = "stuck"  # unchanged (within tolerance) over `window` evaluated steps
    TREND = "trend"  # strictly monotone over `window` evaluated steps
    RANK_MISSING = "rank_missing"  # the step finalized without every expected rank
    REPLICA_MISMATCH = "replica_mismatch"  # replicated copies disagree
    BASELINE = "baseline"  # a sustained departure from the run's own trailing baseline
    STRAGGLER_RANK = "straggler_rank"  # the same rank slowest by more than `threshold`x median
    # reward, length and KL up together off the run's own course (rlmon.service.alerting.reward_hacking)
    REWARD_HACKING = "reward_hacking"
    # judged by time on the aggregator's clock (rlmon.service.liveness), never by a step's values
    RUN_STALLED = "run_stalled"  # no step finalized for the stall threshold, ranks alive
    STAGE_STUCK = "stage_stuck"  # one rank far past its usual time in a stage, others waiting
    RUN_DIED = "run_died"  # every Reporter silent without closing
    RUN_FAILED = "run_failed"  # a rank's process ended by an exception, an exit code, a signal
    RUN_PREEMPTED = "run_preempted"  # ranks stopped by a signal from outside (SIGTERM)
    RUN_FROZEN = "run_frozen"  # every Reporter silent, but a process of the run still exists
    STEP_TIME_REGRESSION = "step_time_regression"  # steps far slower than the run's baseline


class RuleLike(Protocol):
    """The fields of a rule (:class:`rlmon.service.alerting.rules.Rule`) a condition reads; a
    protocol so that the rule model can be built from the kinds without a circle."""

    @property
    def name(self) -> str: ...
    @property
    def severity(self) -> Severity: ...
    @property
    def condition(self) -> Condition: ...
    @property
    def metric(self) -> str: ...
    @property
    def op(self) -> str | None: ...
    @property
    def threshold(self) -> float | None: ...
    @property
    def low(self) -> float | None: ...
    @property
    def high(self) -> float | None: ...
    @property
    def window(self) -> int | None: ...
    @property
    def direction(self) -> str | None: ...
    @property
    def tolerance(self) -> float: ...
    @property
    def resolve_margin(self) -> float | None: ...
    @property
    def roles(self) -> tuple[str, ...] | None: ...
    @property
    def baseline(self) -> BaselineParams: ...
    @property
    def reward_hacking(self) -> RewardHackingParams: ...


class Check(NamedTuple):  # one per rule per step: a tuple is built at a fraction of the cost
    applies: bool
    holds: bool = False
    metric: str = ""
    value: float | None = None
    detail: str = ""


NOT_APPLICABLE = Check(False)


def watched(rule: RuleLike, record: StepRecord) -> float | None:
    """The rule's metric at this step, None where absent or not finite (absent is not zero;
    NaN is NonFiniteMetric's job): such a step is not judged by a one-metric rule."""
    value = record.metrics.get(rule.metric)
    return value if value is not None and math.isfinite(value) else None


# --- the batch half: a long log's columns -----------------------------------------------------

# next index >= start the engine must judge, once the steps before it are counted in the state
Advance = Callable[[AlertState, int], int]


class ColumnSource(Protocol):
    """One (run, role)'s steps in increasing order, by column."""

    @property
    def names(self) -> list[str]:
        """The metrics logged at some step, sorted."""
        ...

    def __len__(self) -> int: ...

    def column(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(values, present) of a metric, one per step."""
        ...


class Columns:
    """A series' columns as the kinds read them: each fetched once, and the two constant masks."""

    def __init__(self, source: ColumnSource) -> None:
        self.source = source
        self.size = len(source)
        self.every = np.ones(self.size, dtype=bool)
        self.never = np.zeros(self.size, dtype=bool)
        self._columns: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    @property
    def names(self) -> list[str]:
        return self.source.names

    def column(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        found = self._columns.get(name)
        if found is None:
            found = self._columns[name] = self.source.column(name)
        return found

    def finite(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(values, the steps where the value is logged and finite): where a one-metric rule
        is judged (:func:`watched`)."""
        values, present = self.column(name)
        return values, present & np.isfinite(values)


def _first(mask: np.ndarray, start: int) -> int:
    found = np.flatnonzero(mask[start:])
    return start + int(found[0]) if found.size else len(mask)


def counted(applies: np.ndarray, holds: np.ndarray) -> Advance:
    """A rule whose check holds only where ``holds``: the applicable steps before the next
    such step are good steps (``false_steps``), counted at once."""
    def advance(state: AlertState, start: int) -> int:
        stop = _first(holds, start)
        count = int(np.count_nonzero(applies[start:stop]))  # ranges never overlap: O(steps)
        if count:
            state.false_steps += count
            state.true_steps = 0
        return stop
    return advance


def never_judged(columns: Columns) -> Advance:
    """A kind a log's records never make applicable: nothing to judge anywhere."""
    return lambda state, start: columns.size


# --- the export half: PromQL ------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class PromQL:
    """A rule's Prometheus alerting expression; ``note``: the caveat printed above it;
    ``quotes_value``: the expression's value is the metric's (the description quotes it)."""

    expr: str
    note: str = ""
    quotes_value: bool = False


class RlmonOnly(StrEnum):
    """Why a rule has no PromQL expression (judged by rlmon only)."""

    NO_SERIES = ("no exported series holds what it judges (a per-metric count, a metric outside "
                 "the catalog)")
    STEP_HISTORY = ("it needs each step's values in order, which PromQL's wall-clock ranges only "
                    "approximate")
    TIMELINES = ("which rank is slowest, and whether it is the same rank step after step, comes "
                 "from the ranks' timelines, which are not exported")
    OPEN_SPANS = "each rank's open spans and a per-run step-time baseline are not exported"
    RUN_STATE = ("it judges each step against the run's own trailing baseline with a score kept "
                 "across steps, per-run step state PromQL does not have")


Export = PromQL | RlmonOnly


def number(value: float | None) -> str:
    """A threshold as PromQL and the docs write it (``0.5``, ``10``)."""
    assert value is not None
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


# --- the kind ---------------------------------------------------------------------------------

class ConditionKind:
    """One condition's meaning; subclasses define each half (see the module's docstring)."""

    condition: ClassVar[Condition]
    # the Rule fields it reads (a rule giving another condition's field is refused), and
    # whether it watches one concrete metric (not "*")
    fields: ClassVar[tuple[str, ...]] = ()
    needs_metric: ClassVar[bool] = False
    by_time: ClassVar[bool] = False  # judged on the liveness timer, never by a step's values

    def check(self, rule: RuleLike, record: StepRecord, state: AlertState) -> Check:
        """The step's verdict; may update what ``state`` keeps for it (its history, its score;
        a straggler's count starts over with another rank)."""
        raise NotImplementedError

    def quiet(self, rule: RuleLike, state: AlertState, columns: Columns) -> Advance | None:
        """How to skip the steps of a log where an idle rule's check cannot hold (called once,
        with the rule's fresh state); None: judge it at every step."""
        return None

    def promql(self, rule: RuleLike) -> Export:
        raise NotImplementedError

    def describe(self, rule: RuleLike) -> str:
        raise NotImplementedError

    def validate(self, rule: RuleLike) -> None:
        """Raise ValueError naming the field when ``rule`` lacks what this condition needs."""


def metric_names(columns: Columns, rule: RuleLike) -> list[str]:
    """The metrics a rule on ``rule.metric`` (or "*": every metric) reads in a log."""
    return columns.names if rule.metric == ANY_METRIC else [rule.metric]


def check_every(rule: RuleLike, metrics: Mapping[str, float]) -> list[str]:
    """The metrics a rule on ``rule.metric`` (or "*") reads at a step, sorted as it reports."""
    return sorted(metrics) if rule.metric == ANY_METRIC else [rule.metric]
