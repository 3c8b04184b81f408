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

from rlmon.service.metrics.forms import FORMS, State, _nan_max, _nan_min
from rlmon.service.metrics.rank import AXES, Rank, replica_group
from rlmon.service.metrics.ranked_forms import Sample
from rlmon.service.metrics.spec import Form

__all__ = [
    "ALL_AXES",
    "REPLICA_RTOL",
    "MetricPool",
    "MetricResult",
    "Partial",
    "RankExtremes",
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


# The lowest and highest of the ranks' own values of a metric in a step, and over how many ranks
# (replica groups: TP/PP copies count once); mergeable by min, max and add (NaN wins, as in the
# forms' min and max).
RankExtremes = tuple[float, float, int]


def merge_extremes(a: RankExtremes | None, b: RankExtremes | None) -> RankExtremes | None:
    """The extremes over the ranks of both (associative and commutative)."""
    if a is None or b is None:
        return a if b is None else b
    return (_nan_min(a[0], b[0]), _nan_max(a[1], b[1]), a[2] + b[2])


def extremes_of(values: list[float]) -> RankExtremes | None:
    """The extremes of ``values`` (one per rank; a NaN among them is both); None when there
    are none."""
    if not values:
        return None
    if any(v != v for v in values):
        return (math.nan, math.nan, len(values))
    return (min(values), max(values), len(values))


@dataclass(frozen=True, slots=True)
class MetricResult:
    """What one metric finalizes to in one step.

    ``extremes``: the lowest and highest rank's own value (each rank's statistic reduced over
    its own records alone, as the step's value is over all of them; one copy per replica group),
    over the ranks whose cells the pool kept apart (a columnar block's ranks are not among them:
    the block keeps its own, :mod:`rlmon.service.aggregation.block`).
    """

    value: float | None
    replica_mismatch: bool = False
    per_rank: tuple[float, ...] = ()
    samples: tuple[Sample, ...] = ()  # a ranked form's items, best first
    extremes: RankExtremes | None = None


class MetricPool:
    """Every contribution to one metric in one step, kept as mergeable cells.

    The cells are per mini-batch (one, 0, unless ``minibatch_mean``), each a map by rank: ranks
    are kept apart so that each rank's own value (the per-rank extremes) and one copy per replica
    group can be told; the rank is None in a cell of ranks already folded together (a columnar
    block's, ``by_rank`` False) and in a ranked form's (its items are pooled as they come). Keyed
    so, adding a rank's state builds no key of its own (a replay of a thousand ranks adds a
    million states a step).
    """

    __slots__ = ("by_rank", "cells", "form", "minibatch_mean", "per_rank", "replicated")

    def __init__(
        self,
        form: Form,
        replicated: frozenset[str] | None,
        minibatch_mean: bool,
        per_rank: bool = False,
        by_rank: bool = True,
    ) -> None:
        """``per_rank``: the result lists every rank's value (a straggler ratio is derived);
        ``by_rank`` False: the cells added are already folded over ranks."""
        self.form = form
        self.replicated = replicated
        self.minibatch_mean = minibatch_mean
        self.per_rank = per_rank
        self.by_rank = (by_rank and FORMS[form].ranked is None) or replicated is not None
        self.cells: dict[int, dict[Rank | None, State]] = {}

    def add(self, rank: Rank, minibatch: int, state: State) -> None:
        mb = minibatch if self.minibatch_mean else 0
        cells = self.cells.get(mb)
        if cells is None:
            cells = self.cells[mb] = {}
        key = rank if self.by_rank else None
        old = cells.get(key)
        cells[key] = state if old is None else combine(self.form, old, state)

    def merge(self, other: MetricPool) -> None:
        """Fold another pool of the same metric and options into this one."""
        for mb, theirs in other.cells.items():
            cells = self.cells.setdefault(mb, {})
            for key, state in theirs.items():
                old = cells.get(key)
                cells[key] = state if old is None else combine(self.form, old, state)

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
            merge = FORMS[form].combine  # one lookup: a rank's cell each (the pool's hot loop)
            for mb, cells in self.cells.items():
                states = iter(cells.values())
                pooled = next(states)
                for state in states:
                    pooled = merge(pooled, state)
                pools[mb] = pooled
        else:
            for mb, cells in self.cells.items():
                groups: dict[Rank, list[tuple[Rank, State]]] = {}
                for rank, state in cells.items():
                    assert rank is not None
                    groups.setdefault(replica_group(rank, self.replicated), []).append(
                        (rank, state))
                for copies in groups.values():
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
        own = self._rank_values()
        per_rank: tuple[float, ...] = ()
        if self.per_rank and self.replicated is None:
            per_rank = tuple(own[r] for r in sorted(own))
        samples: tuple[Sample, ...] = ()
        if FORMS[form].ranked is not None and pools:  # one pool: ranked forms take no options
            samples = tuple(next(iter(pools.values()))[1:])
        return MetricResult(value=value, replica_mismatch=mismatch, per_rank=per_rank,
                            samples=samples, extremes=extremes_of(list(own.values())))

    def _rank_values(self) -> dict[Rank, float]:
        """Each rank's own value (its cells reduced as the pool reduces them all: pooled, or per
        mini-batch then a plain mean), by rank; a replicated metric's per replica group, from
        the group's lowest rank's copy (the one the step's value counts). A rank whose value is
        undefined (a mean over zero tokens) has none."""
        form = self.form
        if self.replicated is None and len(self.cells) == 1:  # one cell per rank
            fin = FORMS[form].finalize
            return {rank: v for rank, state in next(iter(self.cells.values())).items()
                    if rank is not None and (v := fin(state)) is not None}
        by_unit: dict[Rank, dict[int, tuple[Rank, State]]] = {}
        for mb, cells in self.cells.items():
            for rank, state in cells.items():
                if rank is None:  # folded over ranks already
                    continue
                unit = rank if self.replicated is None else replica_group(rank, self.replicated)
                mbs = by_unit.setdefault(unit, {})
                old = mbs.get(mb)
                if old is None or (self.replicated is not None and rank < old[0]):
                    mbs[mb] = (rank, state)
                elif self.replicated is None:
                    mbs[mb] = (rank, combine(form, old[1], state))
        out: dict[Rank, float] = {}
        for unit, mbs in by_unit.items():
            values = [finalize(form, mbs[mb][1]) for mb in sorted(mbs)]
            defined = [v for v in values if v is not None]
            if defined:
                out[unit] = defined[0] if len(defined) == 1 else sum(defined) / len(defined)
        return out


def straggler_ratio(per_rank: tuple[float, ...]) -> float | None:
    """Slowest rank over the median rank; None with fewer than two ranks or a zero median."""
    if len(per_rank) < 2:
        return None
    mid = median(per_rank)
    return max(per_rank) / mid if mid > 0 else None
