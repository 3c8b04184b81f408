"""Partial statistics and their merge: the heart of exact cross-rank reduction.

A rank ships sufficient statistics (docs/design.md, "Ship sufficient statistics, reduce
once"); only :func:`MetricPool.result` divides, once, over everything received. Every state
merge here is associative and commutative, so any split over ranks and micro-batches, any
collector tree and any arrival order give the same value.

Worked example (``{"sum", "count"}``): rank 0 sends (200, 100), rank 1 sends (300, 300). The pool
holds (500, 400) and the result is 1.25; the mean of the rank means would be 1.5.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import median

from rlmon.service.metrics.forms import FORMS, State
from rlmon.service.metrics.rank import AXES, Rank, replica_group
from rlmon.service.metrics.ranked_forms import Sample
from rlmon.service.metrics.spec import Form

__all__ = [
    "ALL_AXES",
    "REPLICA_RTOL",
    "MetricPool",
    "MetricResult",
    "Partial",
    "State",
    "all_agree",
    "combine",
    "copies_agree",
    "finalize",
    "straggler_ratio",
]

ALL_AXES: frozenset[str] = frozenset(AXES)
REPLICA_RTOL = 1e-6

@dataclass(frozen=True, slots=True)
class Partial:
    """One metric's contribution from one record.

    ``replicated`` names the axes over which ranks hold the same copy (None: not replicated).
    ``minibatch_mean`` asks for a per-mini-batch reduction followed by a plain mean.
    """

    form: Form
    state: State
    replicated: frozenset[str] | None = None
    minibatch_mean: bool = False


def combine(form: Form, x: State, y: State) -> State:
    """Merge two states of the same form (associative and commutative)."""
    return FORMS[form].combine(x, y)


def finalize(form: Form, x: State) -> float | None:
    """The value a state stands for; None when it is undefined (a mean over zero tokens)."""
    return FORMS[form].finalize(x)


def _close(a: float, b: float) -> bool:
    if a != a or b != b:
        return a != a and b != b
    return a == b or math.isclose(a, b, rel_tol=REPLICA_RTOL, abs_tol=0.0)


def copies_agree(x: State, y: State) -> bool:
    """Whether two replicated copies hold the same numbers up to a relative 1e-6."""
    return all(_close(a, b) for a, b in zip(x, y, strict=True))


def all_agree(copies: list[State]) -> bool:
    """Whether every two of ``copies`` agree (:func:`copies_agree`), in one pass over each slot.

    Two numbers of opposite signs never agree, and two of the same sign that agree bound every
    number between them, so all pairs agree exactly when each slot's extremes do (NaN agrees only
    with NaN). The verdict depends on the set of copies, never on their order.
    """
    for slot in zip(*copies, strict=True):
        nans = sum(1 for v in slot if v != v)
        if nans:
            if nans != len(slot):
                return False
            continue
        if not _close(min(slot), max(slot)):
            return False
    return True


@dataclass(frozen=True, slots=True)
class MetricResult:
    """What one metric finalizes to in one step."""

    value: float | None
    replica_mismatch: bool = False
    per_rank: tuple[float, ...] = ()
    samples: tuple[Sample, ...] = ()  # a ranked form's items, best first


class MetricPool:
    """Every contribution to one metric in one step, kept as mergeable cells.

    A cell key is (mini-batch, rank). The mini-batch is 0 unless ``minibatch_mean`` is set; the
    rank is None unless copies must be told apart (replicated metrics, or metrics whose per-rank
    spread is wanted), so the common case folds every rank into one cell.
    """

    __slots__ = ("cells", "form", "minibatch_mean", "per_rank", "replicated")

    def __init__(
        self,
        form: Form,
        replicated: frozenset[str] | None,
        minibatch_mean: bool,
        per_rank: bool = False,
    ) -> None:
        self.form = form
        self.replicated = replicated
        self.minibatch_mean = minibatch_mean
        self.per_rank = per_rank or replicated is not None
        self.cells: dict[tuple[int, Rank | None], State] = {}

    def add(self, rank: Rank, minibatch: int, state: State) -> None:
        key = (minibatch if self.minibatch_mean else 0, rank if self.per_rank else None)
        old = self.cells.get(key)
        self.cells[key] = state if old is None else combine(self.form, old, state)

    def merge(self, other: MetricPool) -> None:
        """Fold another pool of the same metric and options into this one."""
        for key, state in other.cells.items():
            old = self.cells.get(key)
            self.cells[key] = state if old is None else combine(self.form, old, state)

    def result(self) -> MetricResult:
        """Dedupe replicas (one copy per group, the lowest rank's), pool, divide once.

        Whether copies disagree is a function of the set of copies, whatever order they came in:
        a replica group mismatches when any two of its copies differ by more than a relative
        ``REPLICA_RTOL`` in any slot, and a ``value`` pool when any two of its copies do.
        """
        form = self.form
        mismatch = False
        pools: dict[int, State] = {}
        if self.replicated is None:
            for (mb, _), state in self.cells.items():
                old = pools.get(mb)
                pools[mb] = state if old is None else combine(form, old, state)
        else:
            groups: dict[tuple[int, Rank], list[tuple[Rank, State]]] = {}
            for (mb, rank), state in self.cells.items():
                assert rank is not None
                groups.setdefault((mb, replica_group(rank, self.replicated)), []).append(
                    (rank, state))
            for (mb, _), copies in groups.items():
                if len(copies) > 1 and not all_agree([state for _, state in copies]):
                    mismatch = True
                _, state = min(copies, key=lambda copy: copy[0])
                old = pools.get(mb)
                pools[mb] = state if old is None else combine(form, old, state)
        if FORMS[form].agree:  # the state spans its lowest and highest copy: they must agree
            mismatch = mismatch or not all(_close(p[0], p[-1]) for p in pools.values())
        values = [finalize(form, pools[mb]) for mb in sorted(pools)]
        defined = [v for v in values if v is not None]
        if not defined:
            value: float | None = None
        elif len(defined) == 1:
            value = defined[0]
        else:
            finite = all(map(math.isfinite, defined))
            value = (math.fsum(defined) if finite else sum(defined)) / len(defined)
        per_rank: tuple[float, ...] = ()
        if self.per_rank and self.replicated is None:
            by_rank: dict[Rank, State] = {}
            for (_, rank), state in self.cells.items():
                assert rank is not None
                old = by_rank.get(rank)
                by_rank[rank] = state if old is None else combine(form, old, state)
            finals = (finalize(form, by_rank[r]) for r in sorted(by_rank))
            per_rank = tuple(v for v in finals if v is not None)
        samples: tuple[Sample, ...] = ()
        if FORMS[form].ranked is not None and pools:  # one pool: ranked forms take no options
            samples = tuple(next(iter(pools.values()))[1:])
        return MetricResult(value=value, replica_mismatch=mismatch, per_rank=per_rank,
                            samples=samples)


def straggler_ratio(per_rank: tuple[float, ...]) -> float | None:
    """Slowest rank over the median rank; None with fewer than two ranks or a zero median."""
    if len(per_rank) < 2:
        return None
    mid = median(per_rank)
    return max(per_rank) / mid if mid > 0 else None
