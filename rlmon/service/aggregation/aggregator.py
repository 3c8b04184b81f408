"""The aggregator's logic without Ray: ingest step messages, finalize steps, keep what must survive.

:class:`AggregatorCore` is what the Aggregator actor runs; tests and benchmarks drive it
in-process. Finalized records wait in an outbox (:mod:`~rlmon.service.aggregation.delivery`,
durable when a :class:`WatermarkStore` is given) until the service acknowledges them, so a restart
loses no finalized step and finalizes none twice; liveness is judged by its desk
(:mod:`~rlmon.service.aggregation.liveness_desk`).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence

from rlmon.service.aggregation.aggregator_stats import AggregatorStats
from rlmon.service.aggregation.assembly import AssemblyCounters, StepAssembler
from rlmon.service.aggregation.deadline import DeadlinePolicy
from rlmon.service.aggregation.delivery import RecordOutbox
from rlmon.service.aggregation.liveness_desk import LivenessDesk
from rlmon.service.aggregation.step_state import StepState
from rlmon.service.aggregation.stream_tracker import StreamTracker
from rlmon.service.aggregation.tier_messages import NodeBatch, ReporterKey
from rlmon.service.aggregation.watermark import WatermarkStore
from rlmon.service.clock import Clock
from rlmon.service.contract.acks import AddOutcome, IngestAck
from rlmon.service.contract.heartbeat import Heartbeat
from rlmon.service.contract.records import (
    ContractError,
)
from rlmon.service.contract.step_message import StepMessage
from rlmon.service.contract.step_record import StepKey, StepRecord
from rlmon.service.contract.stop_decision import StopDecision
from rlmon.service.liveness.run_state import LivenessView
from rlmon.service.liveness.thresholds import LivenessParams
from rlmon.service.metrics.rank import Rank
from rlmon.service.recent import RecentMap

__all__ = ["AggregatorCore", "AggregatorServer"]

log = logging.getLogger(__name__)


class AggregatorCore:
    """Ingest, finalize, deliver, in bounded memory.

    Per-stream state (finalized steps, attempt, deadline, the last finalization) leaves memory
    ``stream_ttl`` seconds after the stream's last report, or when more than ``max_streams``
    streams crowd it out; it is read back from the store when the stream reports again. The
    store forgets streams that finalized nothing for ``retention`` seconds (30 days, as the
    history store). Metric names and schemas are remembered while in use (``RecentMap``); open
    steps are capped by the assembler. What leaves is counted (:meth:`stats`).
    """

    def __init__(
        self,
        *,
        deadline: DeadlinePolicy | None = None,
        store: WatermarkStore | None = None,
        clock: Clock | None = None,
        wall_clock: Clock = time.time,
        max_errors: int = 20,
        stream_ttl: float = 3600.0,
        max_streams: int = 10_000,
        retention: float = 30 * 86400.0,
        liveness: LivenessParams | None = None,
    ) -> None:
        self.assembler = StepAssembler(clock, wall_clock=wall_clock)
        self.deadline = deadline or DeadlinePolicy()
        self.store = store
        self.max_errors = max_errors
        self.lock = threading.RLock()
        self.incarnation = uuid.uuid4().hex
        self.outbox = RecordOutbox(self.assembler, store)
        # each Reporter's running (dropped, refused) counts, as its messages said them
        self.reporter_counts: dict[ReporterKey, tuple[int, int]] = {}
        # node merger id -> last drain seq merged (a restarted merger has a new id)
        self.merged_batches: RecentMap[str, int] = RecentMap(1024)
        # the service's stop decisions of the runs it was sent, passed on in acks (run ->)
        self.stops: RecentMap[str, StopDecision] = RecentMap(4096)
        self._wall = wall_clock
        # Unix time of each stream's latest finalization (kept in the store): a reporter created
        # after it that sends an already finalized step belongs to a rerun of the run; a resend
        # by an older reporter is late. Without a record, this aggregator's start time.
        self.started = wall_clock()
        self.last_finalized: dict[tuple[str, str], float] = {}
        self._late_said: set[tuple[str, str]] = set()
        self.streams = StreamTracker(ttl=stream_ttl, finished_ttl=stream_ttl,
                                     max_streams=max_streams)
        self.retention = retention
        # the state of each stream, evaluated by tick(); views wait there for the service
        self.liveness_desk = LivenessDesk(liveness, self.deadline, now=self.assembler.now,
                                          wall=wall_clock, store=store)
        self.liveness = self.liveness_desk.tracker
        self._batch: list[StepRecord] = []  # finalized in the batch being ingested, not committed
        self.streams_forgotten = 0  # per-stream state that left memory
        self.streams_pruned = 0  # streams the store forgot (retention)
        self._counts_forgotten = (0, 0)  # those of forgotten streams: the totals never fall
        self._next_expiry = self.assembler.now() + min(stream_ttl / 4, 60.0)
        self._next_rotation = self.assembler.now() + stream_ttl
        if store is not None:
            since = self.started - stream_ttl
            self.assembler.finalized.update(store.load(since=since))
            for stream, (attempt, last) in store.load_streams(since=since).items():
                self.assembler.attempts[stream] = attempt
                if last is not None:
                    self.last_finalized[stream] = last
                self.streams.seen(stream, self.assembler.now())
            self.liveness_desk.restore(self._restored)

    def _recall(self, run: str, role: str) -> None:
        """Read a stream's state back from the store when it reports after leaving memory."""
        stream = (run, role)
        if stream in self.streams:
            return
        self._load_stream(stream)
        self._forget(self.streams.seen(stream, self.assembler.now()).streams)

    def _load_stream(self, stream: tuple[str, str]) -> None:
        """A stream's finalized steps, attempt and last finalization, from the store. Every
        stream that enters memory without reporting (a restored liveness state) is read too:
        else a rerun of it would be taken for its first attempt, and the service would drop
        each of the rerun's steps as a redelivery of a stored one."""
        if self.store is None or stream in self.assembler.finalized:
            return
        done, attempt, last = self.store.load_stream(*stream)
        if done is not None:
            self.assembler.finalized[stream] = done
        if attempt:
            self.assembler.attempts[stream] = attempt
        if last is not None:
            self.last_finalized[stream] = last

    def _restored(self, stream: tuple[str, str]) -> None:
        """A stream back in memory with its saved liveness: read whole, aging from now."""
        self._load_stream(stream)
        self._forget(self.streams.seen(stream, self.assembler.now()).streams)

    def _forget(self, streams: list[tuple[str, str]]) -> None:
        """Drop the per-stream state of ``streams`` (those with open steps or records not yet
        delivered stay: they are active)."""
        if not streams:  # the common case, once per message (_recall): no scan of open steps
            return
        busy = ({k[:2] for k in self.assembler.open} | self.outbox.streams()
                | {(r.run, r.role) for r in self._batch})  # a batch is never cut in two
        for stream in streams:
            if stream in busy:
                self.streams.seen(stream, self.assembler.now())
                continue
            self.assembler.forget(*stream)
            self.deadline.forget(*stream)
            self.liveness_desk.forget(stream)
            self.last_finalized.pop(stream, None)
            self._late_said.discard(stream)
            for key in [k for k in self.reporter_counts if k[:2] == stream]:
                dropped, refused = self.reporter_counts.pop(key)
                gone = self._counts_forgotten
                self._counts_forgotten = (gone[0] + dropped, gone[1] + refused)
            self.streams_forgotten += 1

    def _expire(self) -> None:
        now = self.assembler.now()
        if now < self._next_expiry:
            return
        self._next_expiry = now + min(self.streams.ttl / 4, 60.0)
        self._forget(self.streams.expire(now).streams)
        if now >= self._next_rotation:  # names and schemas unused for two TTLs are forgotten
            self._next_rotation = now + self.streams.ttl
            self.assembler.forms.rotate()
            self.assembler.check_message.streams.rotate()
            self.assembler.check_message.schemas.rotate()
        if self.store is not None:
            self.streams_pruned += self.store.prune(self._wall() - self.retention)

    @property
    def counters(self) -> AssemblyCounters:
        return self.assembler.counters

    def _commit(self, records: list[StepRecord]) -> None:
        if not records:
            return
        now = self._wall()
        self.outbox.add(records, now)
        for record in records:
            self.last_finalized[(record.run, record.role)] = now
            self.liveness.finalized(record.run, record.role, record.step, now, record.time)

    def _reporter_counts(self, reporter: ReporterKey, dropped: int, refused: int) -> None:
        """A Reporter's running counts, as its latest message (or node merger) said them."""
        old = self.reporter_counts.get(reporter, (0, 0))
        self.reporter_counts[reporter] = (dropped or old[0], refused or old[1])

    def ingest(self, messages: Iterable[StepMessage]) -> IngestAck:
        ack = IngestAck()
        with self.lock:
            done = self._batch = []
            asm = self.assembler
            wall = self._wall()
            for msg in messages:
                try:
                    msg = asm.validate(msg)
                    key = (msg.run, msg.role, msg.step)
                    self._recall(msg.run, msg.role)
                    opened = key not in asm.open
                    if asm.is_finalized(*key) and self._is_rerun(msg):
                        self._begin_attempt(msg)
                    outcome, record = asm.add_checked(msg)
                except ContractError as exc:
                    ack.refuse(msg, exc, self.max_errors)
                    continue
                self._book(ack, done, key, [msg.rank], opened, outcome, record)
                self.liveness.heard(msg.run, msg.role, msg.rank, msg.world.size, wall)
                if outcome == AddOutcome.ACCEPTED and msg.timeline is not None:
                    self.liveness.spans(msg.run, msg.role, msg.timeline, wall, msg.step)
                if msg.heartbeat is not None:
                    self._heartbeat_of(msg.heartbeat, wall, ack)
                if outcome == AddOutcome.LATE:
                    self._say_late(msg)
                if msg.dropped or msg.refused:
                    self._reporter_counts((msg.run, msg.role, tuple(msg.rank)), msg.dropped,
                                          msg.refused)
                ack.floors.setdefault((msg.run, msg.role), 0)
            self._commit(done)
            self._batch = []
            for run, role in ack.floors:
                finalized = asm.finalized.get((run, role))
                ack.floors[(run, role)] = finalized.floor if finalized is not None else 0
            ack.stops = self._stops_of(run for run, _ in ack.floors)
        ack.finalized = len(done)
        ack.incarnation = self.incarnation
        return ack

    def _is_rerun(self, msg: StepMessage) -> bool:
        """A finalized step sent by a reporter younger than the stream's last finalization."""
        stream = (msg.run, msg.role)
        return msg.started > self.last_finalized.get(stream, self.started)

    def _begin_attempt(self, msg: StepMessage) -> None:
        """Record a rerun of (run, role) as its next attempt (see ``StepAssembler.begin_attempt``)."""
        asm = self.assembler
        self._commit(asm.begin_attempt(msg.run, msg.role))
        self.deadline.forget(msg.run, msg.role)  # the new attempt's ranks start afresh
        attempt = asm.attempts[(msg.run, msg.role)]
        if self.store is not None:
            self.store.begin_attempt(msg.run, msg.role, attempt)
        self._late_said.discard((msg.run, msg.role))
        log.warning("rlmon: %s/%s restarted at step %d: recorded as attempt %d of the run",
                    msg.run, msg.role, msg.step, attempt)

    def _say_late(self, msg: StepMessage) -> None:
        stream = (msg.run, msg.role)
        if stream not in self._late_said:
            self._late_said.add(stream)
            log.warning(
                "rlmon: %s/%s step %d arrived after the step was finalized (a rank past the "
                "deadline, or a resend); not folded in, counted as a late partial (said once "
                "per run and role)", msg.run, msg.role, msg.step)

    def probe(self, run: str, role: str) -> IngestAck:
        """Who this aggregator is and how far (run, role) is finalized, for an idle reporter."""
        with self.lock:
            finalized = self.assembler.finalized.get((run, role))
            floor = finalized.floor if finalized is not None else 0
            stops = self._stops_of([run])
        return IngestAck(incarnation=self.incarnation, floors={(run, role): floor}, stops=stops)

    def learn_stops(self, decisions: Mapping[str, StopDecision]) -> None:
        """Keep the service's stop decisions (its answer to a publish) for the runs' acks."""
        with self.lock:
            for run, decision in decisions.items():
                self.stops[run] = decision

    def _stops_of(self, runs: Iterable[str]) -> dict[str, StopDecision]:
        found = {run: self.stops.get(run) for run in runs}
        return {run: d for run, d in found.items() if d is not None}

    def merge_batch(self, batch: NodeBatch) -> IngestAck:
        """Fold a node merger's batch of pre-merged step states in.

        A bad state is rejected whole (counted, its error in the ack) and the others are kept.
        ``batch.source`` (node merger id, drain seq) makes a retried batch (its ack lost to a
        timeout) a no-op instead of counting twice; what the node merger itself refused (bad,
        late or duplicate messages) is added to this aggregator's counters, so /metrics counts
        every refusal of the tier once.
        """
        ack = IngestAck(incarnation=self.incarnation)
        asm = self.assembler
        with self.lock:
            done = self._batch = []
            wall = self._wall()
            if batch.source is not None:
                merger, seq = batch.source
                last = self.merged_batches.get(merger)
                if last is not None and seq <= last:
                    ack.duplicates = len(batch.states)
                    self._floors(ack, batch.states)
                    return ack
                self.merged_batches[merger] = seq
            asm.counters.rejected += batch.rejected
            asm.counters.late += batch.late
            asm.counters.duplicates += batch.duplicates
            for reporter, (dropped, refused) in batch.reporters.items():
                self._reporter_counts(reporter, dropped, refused)
            for state in batch.states:
                key = (getattr(state, "run", None), getattr(state, "role", None),
                       getattr(state, "step", None))
                opened = key not in asm.open
                try:
                    if isinstance(state, StepState) and isinstance(state.run, str) \
                            and isinstance(state.role, str):
                        self._recall(state.run, state.role)
                    outcome, record = asm.merge_state(state)
                except ContractError as exc:
                    ack.refuse(state, exc, self.max_errors)
                    continue
                self._book(ack, done, (state.run, state.role, state.step), state.finals, opened,
                           outcome, record)
                for rank in state.finals:
                    self.liveness.heard(state.run, state.role, rank, state.world.size, wall)
            for beat in batch.heartbeats:
                self._heartbeat_of(beat, wall, ack)
            self._commit(done)
            self._batch = []
            self._floors(ack, batch.states)
        ack.finalized = len(done)
        return ack

    def _floors(self, ack: IngestAck, states: Sequence[StepState]) -> None:
        for state in states:
            if not isinstance(state, StepState) or not isinstance(state.run, str) \
                    or not isinstance(state.role, str):
                continue
            finalized = self.assembler.finalized.get((state.run, state.role))
            ack.floors[(state.run, state.role)] = finalized.floor if finalized else 0
        ack.stops = self._stops_of(run for run, _ in ack.floors)

    def _book(self, ack: IngestAck, done: list[StepRecord], key: StepKey,
              ranks: Collection[Rank], opened: bool, outcome: str,
              record: StepRecord | None) -> None:
        """The bookkeeping of one message or state that was not refused (``ingest`` and
        ``merge_batch`` alike): count its outcome in the ack, tell the deadline policy who was
        heard, collect the record it finalized."""
        ack.tally(outcome)
        if outcome == AddOutcome.ACCEPTED:
            self._heard(key, ranks, opened, record)
        if record is not None:
            done.append(record)

    def _heard(self, key: StepKey, ranks: Collection[Rank], opened: bool,
               record: StepRecord | None) -> None:
        """Tell the deadline policy who reported ``key`` and when (its period and lags)."""
        now = self.assembler.now()
        state = self.assembler.open.get(key)
        first_seen = state.first_seen if state is not None else (
            record.first_seen if record is not None and record.first_seen is not None else now)
        if opened:
            self.deadline.observe(key[0], key[1], key[2], first_seen)
        self.deadline.heard(key[0], key[1], ranks, key[2], now, first_seen)

    def _waits_for_alive(self, state: StepState, now: float) -> bool:
        return self.deadline.waits_for_alive(state.run, state.role, state.step, state.finals,
                                             state.world.size, now, state.first_seen)

    def heartbeat(self, beats: Iterable[Heartbeat]) -> IngestAck:
        """Heartbeats sent on their own (no step message was due): who is alive and where."""
        ack = IngestAck(incarnation=self.incarnation)
        with self.lock:
            wall = self._wall()
            for beat in beats:
                self._heartbeat_of(beat, wall, ack)
        return ack

    def _heartbeat_of(self, beat: Heartbeat, wall: float, ack: IngestAck) -> None:
        """A heartbeat alone or riding on a step: a bad one is refused (in the ack, counted),
        never the step or the batch it came with."""
        try:
            self._heartbeat(beat, wall)
        except ContractError as exc:  # counted in heartbeats_refused by _heartbeat
            if len(ack.errors) < self.max_errors:
                ack.errors.append(f"{beat_origin(beat)} heartbeat: {exc}")

    def _heartbeat(self, beat: Heartbeat, wall: float) -> None:
        """Fold one heartbeat in; a bad one is counted and said, never costs its step."""
        beat = self.liveness_desk.checked(beat)
        self._recall(beat.run, beat.role)  # a heartbeat keeps its stream in memory
        # not told to the deadline policy: a rank that heartbeats but sends no step (hung on its
        # own) must not hold the others' steps; a step message is what says it is behind
        self.liveness.heartbeat(beat, wall)

    def take_views(self) -> list[LivenessView]:
        """The liveness views due to the service (changed, or the periodic refresh)."""
        with self.lock:
            return self.liveness_desk.take_views()

    def give_back_views(self, views: Iterable[LivenessView]) -> None:
        """Views the service did not take (it was restarting): sent again, unless newer."""
        with self.lock:
            self.liveness_desk.give_back_views(list(views))

    def finish_run(self, run: str) -> None:
        """The run said it finished: its streams are finished, not stalled or dead."""
        with self.lock:
            self.liveness.finish(run, self._wall())

    def tick(self) -> int:
        """Finalize the open steps whose deadline passed (and whose missing ranks are not alive
        and behind); returns how many."""
        with self.lock:
            done = self.assembler.finalize_stale(self.deadline, self._waits_for_alive)
            self._commit(done)
            self._expire()
            self.liveness_desk.tick()
        return len(done)

    def judge_liveness_now(self) -> None:
        """Every stream's state judged now, not at the timer's next evaluation."""
        with self.lock:
            self.liveness_desk.tick(now=True)

    def finalize_all(self) -> int:
        with self.lock:
            done = self.assembler.finalize_all()
            self._commit(done)
        return len(done)

    @property
    def heartbeats_refused(self) -> int:
        return self.liveness_desk.heartbeats_refused

    def pending_records(self, limit: int = 512) -> list[StepRecord]:
        """Finalized records ready for the service, in step order per (run, role) (a record
        waits for an earlier open step of its stream: :meth:`RecordOutbox.pending`)."""
        with self.lock:
            return self.outbox.pending(limit)

    @property
    def held(self) -> int:
        """Finalized records waiting for an earlier open step of their (run, role)."""
        with self.lock:
            return self.outbox.held()

    def delivered(self, records: Sequence[StepRecord]) -> None:
        with self.lock:
            self.outbox.delivered(records)

    def stats(self) -> AggregatorStats:
        with self.lock:
            lat = sorted(self.assembler.finalize_latency)
            return AggregatorStats(
                **dataclasses.asdict(self.assembler.counters),  # its counts, as they stand
                open_steps=len(self.assembler.open),
                incarnation=self.incarnation,
                undelivered=len(self.outbox),
                held_out_of_order=self.held,
                reporter_dropped=(sum(d for d, _ in self.reporter_counts.values())
                                  + self._counts_forgotten[0]),
                reporter_refused=(sum(r for _, r in self.reporter_counts.values())
                                  + self._counts_forgotten[1]),
                finalize_latency_p50=lat[len(lat) // 2] if lat else None,
                streams=len(self.streams),
                streams_forgotten=self.streams_forgotten,
                streams_pruned=self.streams_pruned,
                names_forgotten=self.assembler.forms.forgotten,
            )


def beat_origin(beat: object) -> str:
    """``run/role`` of a heartbeat for an error line, whatever its fields hold."""
    run, role = getattr(beat, "run", None), getattr(beat, "role", None)
    if isinstance(run, str) and isinstance(role, str) and len(run) + len(role) <= 200:
        return f"{run}/{role}"
    return f"a {type(beat).__name__}"


# How liveness views reach the service: (views, shard); raises to retry.
PublishLiveness = Callable[[list[LivenessView], int], None]


# How finalized records reach the service: (records, shard, aggregator stats) -> the service's
# stop decisions for the records' runs (or None); raises to retry.
Publish = Callable[[list[StepRecord], int, AggregatorStats], Mapping[str, StopDecision] | None]


class AggregatorServer:
    """What the actor does, with the service handle injected (a Protocol seam for tests). Its
    delivery thread starts with :meth:`start` (the actor's), never with the constructor."""

    def __init__(
        self, core: AggregatorCore, publish: Publish, shard: int = 0, tick_s: float = 0.02,
        publish_liveness: PublishLiveness | None = None,
    ) -> None:
        self.core, self.publish, self.shard, self.tick_s = core, publish, shard, tick_s
        self.publish_liveness = publish_liveness
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.delivery_errors = 0
        self._published_stats: tuple[int, ...] | None = None
        self._delivering = threading.Lock()  # the loop and close() never publish the same records
        self._thread: threading.Thread | None = None

    def start(self) -> AggregatorServer:
        """Deliver on a thread of its own from now on (idempotent); returns the server."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, daemon=True,
                                            name="rlmon-aggregator")
            self._thread.start()
        return self

    def ingest(self, messages: list[StepMessage]) -> IngestAck:
        ack = self.core.ingest(messages)
        if ack.finalized:
            self._wake.set()
        return ack

    def merge_batch(self, batch: NodeBatch) -> IngestAck:
        ack = self.core.merge_batch(batch)
        if ack.finalized:
            self._wake.set()
        return ack

    def heartbeat(self, beats: list[Heartbeat]) -> IngestAck:
        return self.core.heartbeat(beats)

    def deliver_liveness(self) -> bool:
        """Hand the due liveness views to the service; False when it could not take them."""
        if self.publish_liveness is None:
            return True
        views = self.core.take_views()
        if not views:
            return True
        try:
            self.publish_liveness(views, self.shard)
        except Exception as exc:  # the service is restarting: send them again
            self.core.give_back_views(views)
            self.delivery_errors += 1
            log.warning("liveness delivery to the service failed: %s", exc)
            return False
        return True

    def deliver(self) -> bool:
        """Hand pending records to the service; True when nothing is left undelivered."""
        with self._delivering:
            return self._deliver()

    def _deliver(self) -> bool:
        records = self.core.pending_records()
        stats = self.core.stats()
        counts = stats.said_without_a_step()
        if not records and counts == self._published_stats:
            return True
        try:
            # counters changed without a step (late or rejected records): /metrics shows them now
            stops = self.publish(records, self.shard, stats)
            self._published_stats = counts
        except Exception as exc:  # the service is restarting: keep the records, retry
            self.delivery_errors += 1
            log.warning("delivery to the service failed: %s", exc)
            return False
        self.core.delivered(records)
        if stops:
            self.core.learn_stops(stops)
        return not self.core.pending_records(1)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.tick_s)
            self._wake.clear()
            try:
                # The timer and the liveness views after each hand-over of steps (a resumed
                # run's step comes first), never only once every step is delivered: behind a
                # service slower than a busy stream's steps, states would otherwise stop being
                # judged (a frozen run that went on never resolved, a hang never paged)
                while True:
                    self.core.tick()
                    done = self.deliver()
                    self.deliver_liveness()
                    if done:
                        break
                    if self._stop.wait(0.2):
                        return
            except Exception:
                log.exception("aggregator loop")
                self._stop.wait(0.5)

    def close(self, finalize: bool = True) -> bool:
        if finalize:
            self.core.finalize_all()
        ok = self.deliver()
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(5.0)
        # a script's Reporters close just before its exit shuts the runtime down: judged now,
        # its run is finished and the alerts still firing close with it, instead of staying
        # "firing" in the store for ever (the timer's next evaluation never comes); after the
        # loop stopped, so no older view of its is handed over after this one
        self.core.judge_liveness_now()
        return self.deliver_liveness() and ok
