"""One open step: everything received for it so far, mergeable.

The step assembler keeps one :class:`StepState` per open (run, role, step); a node merger
pre-merges its ranks' messages into the same type and sends it sealed to the root aggregator,
which merges it in. :meth:`StepState.record` turns a closed step into its :class:`StepRecord`.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from rlmon.service.aggregation.block import StepBlock
from rlmon.service.contract.records import ContractError
from rlmon.service.contract.step_message import Schema
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.contract.timeline import (
    MAX_TIMELINE_RANKS,
    RankTimeline,
    Timeline,
    find_straggler,
)
from rlmon.service.metrics import catalog
from rlmon.service.metrics.partial import (
    MetricPool,
    Partial,
    RankExtremes,
    merge_extremes,
    straggler_ratio,
)
from rlmon.service.metrics.rank import Rank, World
from rlmon.service.metrics.ranked_forms import Sample
from rlmon.service.metrics.spec import Form

__all__ = ["MAX_LISTED_MISSING", "Options", "StepState"]

MAX_LISTED_MISSING = 1024  # missing ranks a step record lists (a huge world must stay cheap)


# What a metric's pool is merged as: (form, replicated axes, mini-batch mean). Every record of a
# step must agree on it for each metric.
Options = tuple[Form, frozenset[str] | None, bool]


def _plain(form: Form) -> Options:
    return (form, None, False)


@dataclass(slots=True)
class StepState:
    """Everything received for one open step. Mergeable, so node mergers can pre-merge.

    Plain metrics of step messages accumulate in ``block`` (numpy, the fast path); everything
    else in ``pools``. :meth:`seal` folds the block into the pools when the step closes.
    """

    run: str
    role: str
    step: int
    world: World
    pools: dict[str, MetricPool] = field(default_factory=dict)
    block: StepBlock | None = None
    finals: set[Rank] = field(default_factory=set)
    reporting: set[Rank] = field(default_factory=set)
    seen: set[tuple[Rank, int]] = field(default_factory=set)
    first_seen: float = 0.0
    last_seen: float = 0.0
    time: float | None = None
    # Each rank's timeline, kept per rank (never merged), at most MAX_TIMELINE_RANKS.
    timelines: dict[Rank, Timeline] = field(default_factory=dict)
    timelines_cut: int = 0  # timelines beyond that bound, and spans the ranks cut
    # per metric, the extremes of the ranks' own values that left a sealed block (the pools
    # keep their ranks apart and give theirs at the end)
    extremes: dict[str, RankExtremes] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return len(self.finals) >= self.world.size

    def options(self, name: str) -> Options | None:
        """How ``name`` is merged in this step so far (None: not seen yet)."""
        pool = self.pools.get(name)
        if pool is not None:
            return (pool.form, pool.replicated, pool.minibatch_mean)
        if self.block is not None:
            row = self.block.index.get(name)
            if row is not None:
                return _plain(self.block.forms[row])
        return None

    def check(self, world: World, metrics: Iterable[tuple[str, Options]]) -> None:
        """Raise ContractError if records of ``world`` with ``metrics`` cannot join this step."""
        if world != self.world:
            raise ContractError("world", f"{world.as_dict()} disagrees with "
                                f"{self.world.as_dict()} given by earlier records of step "
                                f"{self.step}")
        for name, options in metrics:
            mine = self.options(name)
            if mine is not None and mine != options:
                raise ContractError(
                    f"metrics.{name}",
                    f"form {options[0].value!r} / replicated / minibatch_reduce differ from "
                    f"earlier records of step {self.step} ({mine[0].value!r})",
                )

    def check_block(self, schema: Schema) -> None:
        """Raise ContractError if a block of ``schema`` cannot join this step: a name it holds
        was merged with other options by a partial. Free when the step knows the schema (its
        names are block rows already), set operations otherwise."""
        block = self.block
        if block is not None and (schema.id == block.primary or schema.id in block.maps):
            return
        clash = self.pools.keys() & set(schema.names)
        if clash:
            forms = dict(zip(schema.names, schema.forms, strict=True))
            self.check(self.world, [(name, _plain(forms[name])) for name in sorted(clash)])

    def add(self, rank: Rank, minibatch: int, metrics: Mapping[str, Partial]) -> None:
        pools = self.pools
        for name, partial in metrics.items():
            pool = pools.get(name)
            if pool is None:
                spec = catalog.lookup(name)
                pool = pools[name] = MetricPool(
                    partial.form,
                    partial.replicated,
                    partial.minibatch_mean,
                    per_rank=spec is not None and spec.per_rank_spread,
                )
            pool.add(rank, minibatch, partial.state)

    def add_block(self, schema: Schema, values: np.ndarray) -> None:
        if self.block is None:
            self.block = StepBlock(schema, values)
        else:
            self.block.merge(schema, values)

    def mark(self, rank: Rank, seq: int | None, final: bool, time: float | None) -> None:
        """Note that ``rank`` reported (its final record when ``final``)."""
        self.reporting.add(rank)
        if final:
            self.finals.add(rank)
        if seq is not None:
            self.seen.add((rank, seq))
        if time is not None:
            self.time = time if self.time is None else max(self.time, time)

    def keep_timeline(self, rank: Rank, timeline: Timeline) -> None:
        """Keep ``rank``'s timeline of the step (bounded; what does not fit is counted)."""
        self.timelines_cut += timeline.cut
        if rank in self.timelines or len(self.timelines) < MAX_TIMELINE_RANKS:
            self.timelines[rank] = timeline
        else:
            self.timelines_cut += len(timeline.spans)

    def seal(self) -> None:
        """Fold the columnar block into the pools (when the step closes or leaves a node)."""
        if self.block is not None:
            self.block.fold_into(self.pools)
            self._merge_extremes(self.block.extremes())
            self.block = None

    def _merge_extremes(self, extremes: Mapping[str, RankExtremes]) -> None:
        for name, ext in extremes.items():
            merged = merge_extremes(self.extremes.get(name), ext)
            assert merged is not None
            self.extremes[name] = merged

    def merge(self, other: StepState) -> None:
        """Fold a sealed, pre-merged state of the same step (from a node merger) into this one."""
        for name, pool in other.pools.items():
            mine = self.pools.get(name)
            if mine is None:
                self.pools[name] = pool
            else:
                mine.merge(pool)
        self.finals |= other.finals
        self.reporting |= other.reporting
        self.seen |= other.seen
        self._merge_extremes(other.extremes)
        self.timelines_cut += other.timelines_cut
        for rank, timeline in other.timelines.items():
            self.keep_timeline(rank, replace(timeline, cut=0))  # its cut is counted above
        if other.time is not None:
            self.time = other.time if self.time is None else max(self.time, other.time)

    def record(self, finalized_at: float | None = None) -> StepRecord:
        self.seal()
        values: dict[str, float] = {}
        mismatches: list[str] = []
        samples: dict[str, tuple[Sample, ...]] = {}
        extremes: dict[str, tuple[float, float]] = {}
        for name, pool in self.pools.items():
            result = pool.result()
            if result.value is not None:
                values[name] = result.value
            ext = merge_extremes(result.extremes, self.extremes.get(name))
            if ext is not None and ext[2] >= 2:  # a spread needs two ranks
                extremes[name] = (ext[0], ext[1])
            if result.samples:
                samples[name] = result.samples
            if result.replica_mismatch:
                mismatches.append(name)
            if name == catalog.STRAGGLER_SOURCE:
                ratio = straggler_ratio(result.per_rank)
                if ratio is not None:
                    values[catalog.STRAGGLER_METRIC] = ratio
        # Every final record's rank was checked to lie in the world, so counting is exact; only
        # the first MAX_LISTED_MISSING missing ranks are listed (a huge world must stay cheap).
        reporting = len(self.finals)
        missing: tuple[Rank, ...] = ()
        if reporting < self.world.size:
            absent = (r for r in self.world.ranks() if r not in self.finals)
            missing = tuple(itertools.islice(absent, MAX_LISTED_MISSING))
        return StepRecord(
            run=self.run,
            role=self.role,
            step=self.step,
            complete=reporting >= self.world.size,
            ranks_expected=self.world.size,
            ranks_reporting=reporting,
            missing_ranks=missing,
            metrics=values,
            replica_mismatches=tuple(sorted(mismatches)),
            first_seen=self.first_seen,
            finalized_at=finalized_at,
            time=self.time,
            timelines=tuple(RankTimeline(r, t) for r, t in sorted(self.timelines.items())),
            timelines_cut=self.timelines_cut,
            straggler=find_straggler([RankTimeline(r, t) for r, t in self.timelines.items()]),
            samples=samples,
            rank_extremes=extremes,
        )
