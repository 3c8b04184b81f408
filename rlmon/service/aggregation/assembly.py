"""Step assembly: fold contract records and step messages into open steps and finalize them.

One :class:`StepAssembler` takes parsed reports (replay), step messages (the live aggregator, a
:class:`~rlmon.actors.reporter.sink.LocalSink`) and node mergers' pre-merged states
(:class:`~rlmon.service.aggregation.step_state.StepState`). A step of (run, role) is complete
when every rank of its world has sent a final record. It can also be finalized early (end of
input, a deadline): it then lists its missing ranks. A record for a step that was already
finalized is late (:class:`~rlmon.service.aggregation.finalized_steps.FinalizedSteps` says
which): counted, never folded into another step. Each rejection, late record and duplicate is
counted once, here.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from rlmon.service.aggregation.finalized_steps import FinalizedSteps
from rlmon.service.aggregation.step_state import Options, StepState
from rlmon.service.clock import Clock
from rlmon.service.contract.acks import AddOutcome
from rlmon.service.contract.records import (
    ContractError,
    Report,
    check_integer,
    check_metric_name,
    check_role,
    check_run,
    check_world,
    show,
)
from rlmon.service.contract.step_message import MessageChecks, Schema, StepMessage
from rlmon.service.contract.step_record import StepKey, StepRecord
from rlmon.service.contract.timeline import RankTimeline, check_rank_timeline
from rlmon.service.metrics import catalog
from rlmon.service.metrics.rank import Rank, World
from rlmon.service.metrics.spec import Form
from rlmon.service.recent import RecentMap

__all__ = ["AssemblyCounters", "StepAssembler"]

MAX_NAMES = 100_000  # metric names whose form is remembered, per generation (see RecentMap)
MAX_SCHEMAS = 4096  # block schemas known to be checked, per generation
MAX_OPEN_STEPS = 100_000  # open steps of all streams; a new step beyond it is refused, counted


@dataclass(slots=True)
class AssemblyCounters:
    """The assembler's running counts: the builder of the snapshot an aggregator publishes,
    :class:`~rlmon.service.aggregation.aggregator_stats.AggregatorStats`, whose fields of the
    same names say what each counts (every one of these is one of its fields)."""

    accepted: int = 0
    rejected: int = 0
    duplicates: int = 0
    late: int = 0
    partials: int = 0
    steps_finalized: int = 0
    steps_incomplete: int = 0
    restarts: int = 0  # new attempts of a (run, role): a rerun under an existing name
    resent: int = 0  # resends (after an aggregator restart) of steps already finalized


class StepAssembler:
    """Merges records per (run, role, step) and hands out finalized :class:`StepRecord` s.

    Three ways in, one bookkeeping: :meth:`add` (a parsed contract record), :meth:`add_message`
    (a rank's step message, its columnar block on the numpy fast path) and :meth:`merge_state`
    (a node merger's pre-merged state). A record that cannot be accepted raises
    :class:`ContractError` and nothing of it is kept. Metric forms are fixed per name for the
    assembler's lifetime: the catalog's forms for canonical names, the first form seen for others.
    """

    def __init__(self, clock: Clock | None = None, max_open: int = MAX_OPEN_STEPS,
                 wall_clock: Clock = time.time) -> None:
        # deadlines and latencies read the monotonic clock; a step's finalized_at is wall time
        # (unix seconds): the history store's retention and `rlmon alerts` compare it with dates
        self._clock: Clock = clock or time.monotonic
        self._wall = wall_clock
        self.finalize_latency: collections.deque[float] = collections.deque(maxlen=256)
        self.max_open = max_open
        self.open: dict[StepKey, StepState] = {}
        self.finalized: dict[tuple[str, str], FinalizedSteps] = {}
        # Forms are fixed per name while the name is in use; names unused for two rotations of
        # the map are forgotten (memory stays bounded however many names producers invent).
        self.forms: RecentMap[str, Form] = RecentMap(MAX_NAMES, on_rotate=self._forget_schemas)
        self.counters = AssemblyCounters()
        self.attempts: dict[tuple[str, str], int] = {}  # absent: attempt 0
        self.check_message = MessageChecks()
        self._schemas: RecentMap[int, bool] = RecentMap(MAX_SCHEMAS)  # block schemas checked

    def now(self) -> float:
        return self._clock()

    def _forget_schemas(self) -> None:
        self._schemas = RecentMap(MAX_SCHEMAS)

    # -- checks (nothing changes until every check passed) --------------------------------------

    def _check_form(self, name: str, form: Form) -> None:
        known = self.forms.get(name)
        if known is not None:
            if known is not form:
                raise ContractError(f"metrics.{name}", f"sends form {form.value!r} but the "
                                    f"metric has form {known.value!r}")
            return
        error = catalog.form_error(name, form)
        if error is not None:
            raise ContractError(f"metrics.{name}", error)

    def _check_schema(self, schema: Schema) -> None:
        """The forms of a block's metrics, checked (and noted) once per schema while it is in
        use; the schema cache is dropped whenever the name map forgets names, so a schema's
        names are noted again before they can be taken for new."""
        if schema.id in self._schemas:
            return
        for name, form in zip(schema.names, schema.forms, strict=True):
            spec = catalog.lookup(name)
            if spec is not None and spec.per_rank_spread:
                raise ContractError(f"metrics.{name}",
                                    "keeps a per-rank spread; send it as a partial")
            self._check_form(name, form)
        for name, form in zip(schema.names, schema.forms, strict=True):
            self.forms.setdefault(name, form)
        self._schemas[schema.id] = True

    def _check(self, key: StepKey, world: World, metrics: list[tuple[str, Options]]) -> None:
        """The forms of ``metrics`` and their agreement with the open step of ``key``."""
        for name, (form, _, _) in metrics:
            self._check_form(name, form)
        state = self.open.get(key)
        if state is not None:
            state.check(world, metrics)

    def is_finalized(self, run: str, role: str, step: int) -> bool:
        done = self.finalized.get((run, role))
        return done is not None and step in done

    def _check_tracked(self, run: str, role: str, step: int) -> None:
        """Raise ContractError for a step in the forgotten span of (run, role) (see
        :class:`FinalizedSteps`): whether it was finalized is no longer known."""
        done = self.finalized.get((run, role))
        if done is not None and done.forgot(step):
            raise ContractError(
                "step",
                f"step {step} of {run}/{role} is older than the steps still tracked (more than "
                f"{done.limit} separate runs of finalized steps came after it): not folded in",
            )

    def _triage(self, key: StepKey, rank: Rank, seq: int | None,
                resend: bool = False) -> str | None:
        """LATE or DUPLICATE (counted) for a record that is not folded in, else None.

        A record of a rank that already sent its final record for the step is late, as it would
        be had the other ranks' final records come first (the step then completed before it). A
        resend of a finalized step was folded in before the aggregator restarted: a duplicate,
        counted as resent, not late.
        """
        if key not in self.open and len(self.open) >= self.max_open:
            raise ContractError("step", f"{len(self.open)} steps are open, the limit: step "
                                f"{key[2]} of {key[0]}/{key[1]} refused (steps open faster "
                                "than they finalize)")
        if self.is_finalized(*key):
            if resend:
                self.counters.resent += 1
                return AddOutcome.DUPLICATE
            self.counters.late += 1
            return AddOutcome.LATE
        self._check_tracked(*key)
        state = self.open.get(key)
        if state is not None:
            if seq is not None and (rank, seq) in state.seen:
                self.counters.duplicates += 1
                return AddOutcome.DUPLICATE
            if rank in state.finals:
                self.counters.late += 1
                return AddOutcome.LATE
        return None

    def _rejected(self, exc: ContractError) -> ContractError:
        self.counters.rejected += 1  # the one place a rejection is counted
        return exc

    # -- the three ways in ----------------------------------------------------------------------

    def add(self, report: Report) -> tuple[str, StepRecord | None]:
        """Fold one parsed record in; returns the outcome and the step record if it completed
        the step."""
        key = (report.run, report.role, report.step)
        try:
            outcome = self._triage(key, report.rank, report.seq)
            if outcome is not None:
                return outcome, None
            self._check(key, report.world, [
                (n, (p.form, p.replicated, p.minibatch_mean)) for n, p in report.metrics.items()])
        except ContractError as exc:
            raise self._rejected(exc) from None
        state = self._open(key, report.world)
        state.add(report.rank, report.minibatch, report.metrics)
        state.mark(report.rank, report.seq, report.final, report.time)
        return self._accepted(key, state, [(n, p.form) for n, p in report.metrics.items()])

    def validate(self, msg: object) -> StepMessage:
        """The contract's checks on a step message from any producer (counted when it fails)."""
        try:
            return self.check_message(msg)
        except ContractError as exc:
            raise self._rejected(exc) from None

    def add_message(self, msg: StepMessage) -> tuple[str, StepRecord | None]:
        """Validate and fold one step message in (all or nothing)."""
        return self.add_checked(self.validate(msg))

    def add_checked(self, msg: StepMessage) -> tuple[str, StepRecord | None]:
        """Fold a message that passed :meth:`validate` in (all or nothing).

        The columnar block is the fast path: its schema's forms are checked once per schema,
        and against the step only where the step has not seen that schema yet."""
        key = (msg.run, msg.role, msg.step)
        cols = msg.columns
        try:
            outcome = self._triage(key, msg.rank, msg.seq, msg.resend)
            if outcome is not None:
                return outcome, None
            metrics = [(n, (p.form, p.replicated, p.minibatch_mean))
                       for _, group in msg.partials for n, p in group.items()]
            self._check(key, msg.world, metrics)
            if cols is not None:
                self._check_schema(cols.schema)
                if metrics:
                    both = set(cols.schema.names).intersection(n for n, _ in metrics)
                    if both:
                        raise ContractError(f"metrics.{min(both)}",
                                            "sent both in the columnar block and as a partial")
                state = self.open.get(key)
                if state is not None:
                    state.check_block(cols.schema)
        except ContractError as exc:
            raise self._rejected(exc) from None
        state = self._open(key, msg.world)
        if cols is not None:
            state.add_block(cols.schema, cols.values)
        for minibatch, group in msg.partials:
            state.add(msg.rank, minibatch, group)
        state.mark(msg.rank, msg.seq, True, msg.time)
        if msg.timeline is not None:
            state.keep_timeline(msg.rank, msg.timeline)
        n_block = len(cols.schema.names) if cols is not None else 0
        return self._accepted(key, state, [(n, f) for n, (f, _, _) in metrics], n_block)

    def merge_state(self, other: StepState) -> tuple[str, StepRecord | None]:
        """Fold a node merger's sealed state in; returns the outcome and the record if that
        completed the step. A state carrying a rank's record the step already holds (a resend
        the node merger could not recognise, after its restart) cannot be split from the other
        ranks' records it was merged with: it is counted as a duplicate, not folded in."""
        try:
            self._check_state(other)
            key = (other.run, other.role, other.step)
            if self.is_finalized(*key):
                self.counters.late += 1
                return AddOutcome.LATE, None
            self._check_tracked(*key)
            state = self.open.get(key)
            if state is not None and (other.seen & state.seen or other.finals & state.finals):
                self.counters.duplicates += 1
                return AddOutcome.DUPLICATE, None
            self._check(key, other.world, [
                (n, (p.form, p.replicated, p.minibatch_mean)) for n, p in other.pools.items()])
        except ContractError as exc:
            raise self._rejected(exc) from None
        other.seal()
        now = self._clock()
        if state is None:
            other.first_seen = other.last_seen = now
            self.open[key] = state = other
        else:
            state.merge(other)
            state.last_seen = now
        for name, pool in other.pools.items():
            self.forms.setdefault(name, pool.form)
        self.counters.accepted += 1
        return AddOutcome.ACCEPTED, self.finalize(key) if state.complete else None

    @staticmethod
    def _check_state(state: object) -> None:
        """The contract's checks on a node merger's state (any sender: it comes over Ray)."""
        if not isinstance(state, StepState):
            raise ContractError("", f"must be a StepState, got {show(state)}")
        check_run(state.run)
        check_role(state.role)
        check_integer(state.step, "step")
        check_world(state.world)
        for name in state.pools:
            check_metric_name(name)
        if not isinstance(state.timelines, dict):
            raise ContractError("timelines", f"must be {{rank: Timeline}}, got "
                                f"{show(state.timelines)}")
        for rank, timeline in state.timelines.items():
            check_rank_timeline(RankTimeline(rank, timeline))
        check_integer(state.timelines_cut, "timelines_cut")
        if not isinstance(state.extremes, dict):
            raise ContractError("extremes", f"must be {{metric: (low, high, ranks)}}, got "
                                f"{show(state.extremes)}")
        for name, ext in state.extremes.items():
            if name not in state.pools or not (
                    isinstance(ext, tuple) and len(ext) == 3
                    and all(isinstance(v, float | int) for v in ext[:2])
                    and isinstance(ext[2], int) and ext[2] > 0):
                raise ContractError(f"extremes.{show(name)}", "must be (low, high, ranks) of a "
                                    f"metric of the state, got {show(ext)}")

    # -- bookkeeping ----------------------------------------------------------------------------

    def _open(self, key: StepKey, world: World) -> StepState:
        state = self.open.get(key)
        if state is None:
            state = self.open[key] = StepState(*key, world, first_seen=self._clock())
        return state

    def _accepted(
        self, key: StepKey, state: StepState, partials: list[tuple[str, Form]],
        block_partials: int = 0,
    ) -> tuple[str, StepRecord | None]:
        """Count an accepted record of ``partials`` (name, form; a block's names were noted with
        its schema) and close a complete step."""
        for name, form in partials:
            self.forms.setdefault(name, form)
        state.last_seen = self._clock()
        self.counters.accepted += 1
        self.counters.partials += len(partials) + block_partials
        if state.complete:
            return AddOutcome.ACCEPTED, self.finalize(key)
        return AddOutcome.ACCEPTED, None

    def finalize(self, key: StepKey) -> StepRecord:
        """Close one open step now, complete or not."""
        state = self.open.pop(key)
        self.finalized.setdefault((state.run, state.role), FinalizedSteps()).add(state.step)
        record = state.record(finalized_at=self._wall())
        self.finalize_latency.append(self._clock() - state.first_seen)  # first partial -> now
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

    def forget(self, run: str, role: str) -> None:
        """Drop what is kept of a stream with no open step (it went quiet: bounded memory)."""
        self.finalized.pop((run, role), None)
        self.attempts.pop((run, role), None)

    def finalize_all(self) -> list[StepRecord]:
        """Close every open step (end of input), in (run, role, step) order."""
        return [self.finalize(key) for key in sorted(self.open)]

    def finalize_stale(
        self,
        deadline_s: float | Callable[[str, str], float],
        still_waiting: Callable[[StepState, float], bool] | None = None,
    ) -> list[StepRecord]:
        """Close the open steps whose last record is older than their deadline (unless
        ``still_waiting`` says a missing rank is alive and behind)."""
        now = self._clock()
        stale = [
            key
            for key, state in self.open.items()
            if now - state.last_seen
            >= (deadline_s(state.run, state.role) if callable(deadline_s) else deadline_s)
            and not (still_waiting is not None and still_waiting(state, now))
        ]
        return [self.finalize(key) for key in sorted(stale)]
