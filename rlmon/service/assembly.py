"""Step assembly: fold validated reports into open steps and finalize them.

A step of (run, role) is complete when every rank of its world has sent a final record. It can
also be finalized early (end of input, a deadline): it then lists its missing ranks. A report for a
step that was already finalized is late: counted, never folded into another step.
"""

from __future__ import annotations

import bisect
import itertools
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace

from rlmon.service import catalog
from rlmon.service.partial import MetricPool, straggler_ratio
from rlmon.service.rank import Rank, World
from rlmon.service.report import ContractError, Report
from rlmon.service.spec import Form
from rlmon.service.step import StepKey, StepRecord

__all__ = [
    "MAX_LISTED_MISSING",
    "AddOutcome",
    "AssemblyCounters",
    "FinalizedSteps",
    "StepAssembler",
    "StepState",
]

Clock = Callable[[], float]
MAX_LISTED_MISSING = 1024


class AddOutcome:
    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"
    LATE = "late"


@dataclass(slots=True)
class AssemblyCounters:
    accepted: int = 0
    rejected: int = 0
    duplicates: int = 0
    late: int = 0
    partials: int = 0
    steps_finalized: int = 0
    steps_incomplete: int = 0
    restarts: int = 0  # new attempts of a (run, role): a rerun under an existing name


class FinalizedSteps:
    """Which steps of one (run, role) are finalized, in bounded memory.

    Everything below ``floor`` is finalized; above it, disjoint ``[start, end)`` intervals, so a
    run of consecutive steps costs one interval however long it is. A step that never arrived is
    never taken for finalized. Memory is bounded by ``limit`` intervals: when more separate
    intervals pile up (a run with thousands of gaps), the oldest is *forgotten*: the span from
    it up to the next interval joins the forgotten span ``[forgotten_from, forgotten_to)``, where
    it is no longer known which steps were finalized. A record for a step there is neither late
    nor a new step: the assembler rejects it (:meth:`forgot`), so no step that was never finalized
    is counted late, and none is finalized twice.
    """

    __slots__ = ("_ends", "_starts", "floor", "forgotten_from", "forgotten_to", "limit")

    def __init__(self, floor: int = 0, limit: int = 4096) -> None:
        self.floor = floor
        self.limit = limit
        self.forgotten_from = self.forgotten_to = floor  # empty
        self._starts: list[int] = []
        self._ends: list[int] = []

    def __contains__(self, step: int) -> bool:
        if step < self.floor:
            return True
        if self.forgotten_from <= step < self.forgotten_to:
            return False
        i = bisect.bisect_right(self._starts, step) - 1
        return i >= 0 and step < self._ends[i]

    def forgot(self, step: int) -> bool:
        """Whether ``step`` lies in the forgotten span (finalized or not, no longer known)."""
        return self.forgotten_from <= step < self.forgotten_to

    def add(self, step: int) -> None:
        if step in self or self.forgot(step):
            return
        starts, ends = self._starts, self._ends
        i = bisect.bisect_right(starts, step)
        joins_left = i > 0 and ends[i - 1] == step
        joins_right = i < len(starts) and starts[i] == step + 1
        if joins_left and joins_right:
            ends[i - 1] = ends[i]
            del starts[i], ends[i]
        elif joins_left:
            ends[i - 1] = step + 1
        elif joins_right:
            starts[i] = step
        else:
            starts.insert(i, step)
            ends.insert(i, step + 1)
        while len(starts) > 1 and len(starts) + (
                self.forgotten_to > self.forgotten_from) > self.limit:
            # Forget the oldest interval: the span from it to the next one joins the forgotten
            # span (one span: intervals are never inside it, so any below it go with it).
            empty = self.forgotten_to <= self.forgotten_from
            self.forgotten_from = starts[0] if empty else min(self.forgotten_from, starts[0])
            self.forgotten_to = max(self.forgotten_to, starts[1])
            k = bisect.bisect_left(starts, self.forgotten_to)
            del starts[:k], ends[:k]
        if starts and starts[0] <= self.floor:
            self.floor = max(self.floor, ends[0])
            del starts[0], ends[0]

    @property
    def high(self) -> int:
        """One past the highest finalized step (``floor`` when nothing lies above it)."""
        if self._ends:
            return self._ends[-1]
        return max(self.floor, self.forgotten_to)

    def intervals(self) -> list[tuple[int, ...]]:
        """The finalized ``[start, end)`` intervals above ``floor``, in order; a forgotten span
        comes first as ``(start, end, 0)`` (what :meth:`restore` reads back)."""
        spans: list[tuple[int, ...]] = []
        if self.forgotten_to > self.forgotten_from:
            spans.append((self.forgotten_from, self.forgotten_to, 0))
        spans.extend(zip(self._starts, self._ends, strict=True))
        return spans

    @classmethod
    def restore(cls, floor: int, intervals: Iterable[Iterable[int] | int]) -> FinalizedSteps:
        """Rebuild from :meth:`intervals` (single steps, as older watermarks stored, also work)."""
        done = cls(floor)
        items: list[tuple[int, ...]] = []
        for item in intervals:
            span = (item, item + 1) if isinstance(item, int) else tuple(item)
            if len(span) == 3:
                done.forgotten_from, done.forgotten_to = span[0], span[1]
            else:
                items.append(span)
        for start, end in sorted(items):
            if end <= done.high or start < done.forgotten_to:
                for step in range(start, end):  # covered, or out of order: step by step
                    done.add(step)
            elif start <= done.high and done._ends:
                done._ends[-1] = end
            elif start <= done.floor:
                done.floor = end
            else:
                done._starts.append(start)
                done._ends.append(end)
        return done


@dataclass(slots=True)
class StepState:
    """Everything received for one open step. Mergeable, so node mergers can pre-merge."""

    run: str
    role: str
    step: int
    world: World
    pools: dict[str, MetricPool] = field(default_factory=dict)
    finals: set[Rank] = field(default_factory=set)
    reporting: set[Rank] = field(default_factory=set)
    seen: set[tuple[Rank, int]] = field(default_factory=set)
    first_seen: float = 0.0
    last_seen: float = 0.0
    time: float | None = None

    @property
    def complete(self) -> bool:
        return len(self.finals) >= self.world.size

    def check(self, report: Report) -> None:
        """Raise ContractError if the report cannot join this step (before anything changes)."""
        if report.world != self.world:
            raise ContractError(
                "world",
                f"{report.world.as_dict()} disagrees with {self.world.as_dict()} given by earlier "
                f"records of step {self.step}",
            )
        for name, partial in report.metrics.items():
            pool = self.pools.get(name)
            if pool is not None and not pool.options_match(partial):
                raise ContractError(
                    f"metrics.{name}",
                    f"form {partial.form.value!r} / replicated / minibatch_reduce differ from "
                    f"earlier records of step {self.step} ({pool.form.value!r})",
                )

    def add(self, report: Report) -> None:
        rank, minibatch = report.rank, report.minibatch
        pools = self.pools
        for name, partial in report.metrics.items():
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
        self.reporting.add(rank)
        if report.final:
            self.finals.add(rank)
        if report.seq is not None:
            self.seen.add((rank, report.seq))
        if report.time is not None:
            self.time = report.time if self.time is None else max(self.time, report.time)

    def merge(self, other: StepState) -> None:
        """Fold a pre-merged state of the same step (from a node merger) into this one."""
        if other.world != self.world:
            raise ContractError("world", f"node merger world {other.world} != {self.world}")
        for name, pool in other.pools.items():
            mine = self.pools.get(name)
            if mine is None:
                self.pools[name] = pool
            else:
                mine.merge(pool)
        self.finals |= other.finals
        self.reporting |= other.reporting
        self.seen |= other.seen
        if other.time is not None:
            self.time = other.time if self.time is None else max(self.time, other.time)

    def record(self, finalized_at: float | None = None) -> StepRecord:
        values: dict[str, float] = {}
        mismatches: list[str] = []
        for name, pool in self.pools.items():
            result = pool.result()
            if result.value is not None:
                values[name] = result.value
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
        )


class StepAssembler:
    """Merges reports per (run, role, step) and hands out finalized :class:`StepRecord` s.

    ``add`` raises :class:`ContractError` for a record that cannot be accepted; nothing of that
    record is kept. Metric forms are fixed per name for the assembler's lifetime: the catalog's
    forms for canonical names, the first form seen for others.
    """

    def __init__(self, clock: Clock | None = None) -> None:
        self._clock: Clock = clock or time.monotonic
        self.open: dict[StepKey, StepState] = {}
        self.finalized: dict[tuple[str, str], FinalizedSteps] = {}
        self.forms: dict[str, Form] = {}
        self.counters = AssemblyCounters()
        self.attempts: dict[tuple[str, str], int] = {}  # absent: attempt 0

    def _check_forms(self, report: Report) -> None:
        for name, partial in report.metrics.items():
            known = self.forms.get(name)
            if known is not None:
                if known is not partial.form:
                    raise ContractError(
                        f"metrics.{name}",
                        f"sends form {partial.form.value!r} but the metric has form "
                        f"{known.value!r}",
                    )
                continue
            spec = catalog.lookup(name)
            if spec is not None and partial.form not in spec.forms:
                allowed = " or ".join(repr(f.value) for f in spec.forms)
                raise ContractError(
                    f"metrics.{name}",
                    f"sends form {partial.form.value!r} but the catalog defines {allowed}",
                )

    def is_finalized(self, run: str, role: str, step: int) -> bool:
        done = self.finalized.get((run, role))
        return done is not None and step in done

    def check_tracked(self, run: str, role: str, step: int) -> None:
        """Raise ContractError for a step in the forgotten span of (run, role) (see
        :class:`FinalizedSteps`): whether it was finalized is no longer known."""
        done = self.finalized.get((run, role))
        if done is not None and done.forgot(step):
            raise ContractError(
                "step",
                f"step {step} of {run}/{role} is older than the steps still tracked (more than "
                f"{done.limit} separate runs of finalized steps came after it): not folded in",
            )

    def add(self, report: Report) -> tuple[str, StepRecord | None]:
        """Fold one report in; returns the outcome and the step record if it completed the step.

        A report of a rank that already sent its final record for the step is late, as it would
        be had the other ranks' final records come first (the step then completed before it).
        """
        key = (report.run, report.role, report.step)
        if self.is_finalized(*key):
            self.counters.late += 1
            return AddOutcome.LATE, None
        try:
            self.check_tracked(*key)
        except ContractError:
            self.counters.rejected += 1
            raise
        state = self.open.get(key)
        if state is not None and report.seq is not None and (report.rank, report.seq) in state.seen:
            self.counters.duplicates += 1
            return AddOutcome.DUPLICATE, None
        if state is not None and report.rank in state.finals:
            self.counters.late += 1
            return AddOutcome.LATE, None
        try:
            self._check_forms(report)
            if state is not None:
                state.check(report)
        except ContractError:
            self.counters.rejected += 1
            raise
        for name, partial in report.metrics.items():
            self.forms.setdefault(name, partial.form)
        now = self._clock()
        if state is None:
            state = self.open[key] = StepState(
                report.run, report.role, report.step, report.world, first_seen=now
            )
        state.add(report)
        state.last_seen = now
        self.counters.accepted += 1
        self.counters.partials += len(report.metrics)
        if state.complete:
            return AddOutcome.ACCEPTED, self.finalize(key)
        return AddOutcome.ACCEPTED, None

    def merge_state(self, other: StepState) -> StepRecord | None:
        """Fold a node merger's pre-merged state in; returns the record if that completed the step."""
        key = (other.run, other.role, other.step)
        if self.is_finalized(*key):
            self.counters.late += 1
            return None
        state = self.open.get(key)
        if state is None:
            other.first_seen = other.last_seen = self._clock()
            self.open[key] = other
            state = other
        else:
            state.merge(other)
            state.last_seen = self._clock()
        return self.finalize(key) if state.complete else None

    def finalize(self, key: StepKey) -> StepRecord:
        """Close one open step now, complete or not."""
        state = self.open.pop(key)
        self.finalized.setdefault((state.run, state.role), FinalizedSteps()).add(state.step)
        record = state.record(finalized_at=self._clock())
        attempt = self.attempts.get((state.run, state.role))
        if attempt:
            record = replace(record, attempt=attempt)
        self.counters.steps_finalized += 1
        if not record.complete:
            self.counters.steps_incomplete += 1
        return record

    def begin_attempt(self, run: str, role: str) -> list[StepRecord]:
        """Start a new attempt of (run, role): a rerun under the same name.

        Its open steps finalize now as the old attempt's (returned), its finalized steps are
        forgotten, and its next steps are recorded under the next attempt number.
        """
        stream = (run, role)
        old = [self.finalize(key) for key in sorted(k for k in self.open if k[:2] == stream)]
        self.finalized.pop(stream, None)
        self.attempts[stream] = self.attempts.get(stream, 0) + 1
        self.counters.restarts += 1
        return old

    def finalize_all(self) -> list[StepRecord]:
        """Close every open step (end of input), in (run, role, step) order."""
        return [self.finalize(key) for key in sorted(self.open)]

    def finalize_stale(self, deadline_s: float | Callable[[str, str], float]) -> list[StepRecord]:
        """Close the open steps whose last report is older than their deadline."""
        now = self._clock()
        stale = [
            key
            for key, state in self.open.items()
            if now - state.last_seen
            >= (deadline_s(state.run, state.role) if callable(deadline_s) else deadline_s)
        ]
        return [self.finalize(key) for key in sorted(stale)]

    def add_many(self, reports: Iterable[Report]) -> Iterator[StepRecord]:
        for report in reports:
            _, record = self.add(report)
            if record is not None:
                yield record


