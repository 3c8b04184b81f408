"""The optional per-node merge tier: pre-merge the node's step messages, forward step states.

Partials are associative and commutative, so merging a node's ranks first and the nodes' states
at the root gives the same result as merging every rank at the root
(``tests/unit/aggregation/test_aggregator_columnar.py``). The root then receives one state per
node and step instead of one message per rank. A node merger never finalizes: it does not know
the world, only its ranks.

Delivery is exactly-once as far as the root can tell: each drained batch carries (node merger id,
drain seq), so a batch retried after a lost ack is not merged twice; the merger answers a
reporter with the root's incarnation (combined with its own), so reporters resend what a
restarted root (or node merger) lost, and with the stop decisions the root passed on for the
reporter's run (``rlmon.service.contract.stop_decision``), and a resend is taken again only when
what it duplicates
went to a root that no longer holds it.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterable, Sequence

from rlmon.service.aggregation.step_state import StepState
from rlmon.service.aggregation.tier_messages import NodeBatch, ReporterKey
from rlmon.service.contract.acks import IngestAck
from rlmon.service.contract.heartbeat import Heartbeat
from rlmon.service.contract.records import ContractError
from rlmon.service.contract.step_message import MessageChecks, StepMessage
from rlmon.service.contract.step_record import StepKey
from rlmon.service.contract.stop_decision import StopDecision
from rlmon.service.metrics.rank import Rank
from rlmon.service.recent import RecentMap

__all__ = ["NodeMerger"]

# (run, role, step, rank, seq): a message, keyed by step so a restarted worker whose seq starts
# at 1 again is not taken for a resend of an earlier step.
_SeenKey = tuple[str, str, int, Rank, int]
_PENDING = ""  # a seen message not yet merged into any root


class NodeMerger:
    """Pre-merges messages into :class:`StepState` s; :meth:`next_batch` hands them on."""

    def __init__(self, remember: int = 65536) -> None:
        self.id = uuid.uuid4().hex
        self.states: dict[StepKey, StepState] = {}
        self.remember = remember
        # seen message -> the root incarnation its state was merged into (_PENDING: not yet)
        self._seen: dict[_SeenKey, str] = {}
        self.root_incarnation = _PENDING
        self.floors: RecentMap[tuple[str, str], int] = RecentMap(4096)
        self.stops: RecentMap[str, StopDecision] = RecentMap(4096)  # the root's, passed on
        self.duplicates = 0
        self.late = 0  # a rank's message after its own final one for the step (not folded)
        self.rejected = 0  # messages breaking the contract (the aggregator's checks)
        self._unsent = (0, 0, 0)  # (rejected, late, duplicates) when the last batch was cut
        # Reporters' running (dropped, refused) counts that changed since the last batch
        self._reporters: dict[ReporterKey, tuple[int, int]] = {}
        # the latest heartbeat riding on each Reporter's messages, handed on to the root
        self._beats: dict[ReporterKey, Heartbeat] = {}
        self.check = MessageChecks()
        self._drains = 0
        self.lock = threading.Lock()

    def add(self, msg: StepMessage) -> bool:
        """Fold one message in; False for a resend of a message the root still holds (or a
        rank's message after its own final one). A message breaking the contract raises
        :class:`ContractError` and changes nothing (the aggregator's checks, shared)."""
        with self.lock:
            try:
                msg = self.check(msg)
                key = (msg.run, msg.role, msg.step)
                state = self.states.get(key)
                if state is not None:
                    metrics = [(n, (p.form, p.replicated, p.minibatch_mean))
                               for _, group in msg.partials for n, p in group.items()]
                    if msg.columns is not None:
                        metrics += [(n, (f, None, False)) for n, f in zip(
                            msg.columns.schema.names, msg.columns.schema.forms, strict=True)]
                    state.check(msg.world, metrics)
            except ContractError:
                self.rejected += 1
                raise
            seen_key = (msg.run, msg.role, msg.step, msg.rank, msg.seq)
            where = self._seen.get(seen_key)
            if where is not None and (where == _PENDING or where == self.root_incarnation):
                self.duplicates += 1
                return False
            if state is not None and msg.rank in state.finals:
                self.late += 1
                return False
            self._seen[seen_key] = _PENDING
            if msg.dropped or msg.refused:
                self._reporters[(msg.run, msg.role, tuple(msg.rank))] = (msg.dropped, msg.refused)
            if msg.heartbeat is not None:
                self._beats[(msg.run, msg.role, tuple(msg.rank))] = msg.heartbeat
            while len(self._seen) > self.remember:
                del self._seen[next(iter(self._seen))]
            if state is None:
                state = self.states[key] = StepState(msg.run, msg.role, msg.step, msg.world)
            if msg.columns is not None:
                state.add_block(msg.columns.schema, msg.columns.values)
            for minibatch, group in msg.partials:
                state.add(msg.rank, minibatch, group)
            state.mark(msg.rank, msg.seq, True, msg.time)
            if msg.timeline is not None:
                state.keep_timeline(msg.rank, msg.timeline)
            return True

    def ingest(self, messages: Sequence[StepMessage], max_errors: int = 20) -> IngestAck:
        """Fold a reporter's batch in: a bad message is rejected whole (counted, its error in
        the ack), the others are kept."""
        refused = IngestAck()
        accepted = 0
        for msg in messages:
            try:
                accepted += self.add(msg)
            except ContractError as exc:
                refused.refuse(msg, exc, max_errors)
        ack = self.ack(messages, accepted)
        ack.duplicates -= refused.rejected
        ack.rejected, ack.errors = refused.rejected, refused.errors
        return ack

    def drain(self) -> list[StepState]:
        """Every pre-merged state since the last drain, sealed (blocks folded into pools)."""
        with self.lock:
            states, self.states = self.states, {}
        for state in states.values():
            state.seal()
        return [states[key] for key in sorted(states)]

    def next_batch(self) -> NodeBatch | None:
        """The next drained batch, or None when there is nothing to hand on."""
        states = self.drain()
        with self.lock:
            counts = (self.rejected, self.late, self.duplicates)
            rejected, late, duplicates = (a - b for a, b in zip(counts, self._unsent, strict=True))
            self._unsent = counts
            reporters, self._reporters = self._reporters, {}
            beats, self._beats = list(self._beats.values()), {}
        if not states and not (rejected or late or duplicates or reporters or beats):
            return None
        self._drains += 1
        return NodeBatch(states, (self.id, self._drains), rejected, late, duplicates, reporters,
                         beats)

    def merged(self, batch: NodeBatch, ack: IngestAck) -> None:
        """The root took ``batch``: remember which root holds its messages, and its floors."""
        with self.lock:
            self.learn(ack)
            for state in batch.states:
                for rank, seq in state.seen:
                    key = (state.run, state.role, state.step, rank, seq)
                    if key in self._seen:
                        self._seen[key] = ack.incarnation

    def learn(self, ack: IngestAck) -> None:
        self.root_incarnation = ack.incarnation or self.root_incarnation
        for stream, floor in ack.floors.items():
            self.floors[stream] = floor
        for run, decision in ack.stops.items():
            self.stops[run] = decision

    def ack(self, messages: Sequence[StepMessage], accepted: int) -> IngestAck:
        """What a reporter gets back: counts, floors, and an incarnation that changes when
        this merger or its root restarted (so the reporter resends what was lost)."""
        streams = {(m.run, m.role) for m in messages if isinstance(m, StepMessage)
                   and isinstance(m.run, str) and isinstance(m.role, str)}
        return IngestAck(
            accepted=accepted, duplicates=len(messages) - accepted,
            incarnation=f"{self.id}:{self.root_incarnation}",
            floors={s: self.floors.get(s) or 0 for s in streams},
            stops=self._stops_of({run for run, _ in streams}),
        )

    def probe(self, run: str, role: str) -> IngestAck:
        """What an idle reporter of (run, role) gets: the incarnation and the run's stop."""
        ack = self.ack([], 0)
        ack.stops = self._stops_of([run])
        return ack

    def _stops_of(self, runs: Iterable[str]) -> dict[str, StopDecision]:
        found = {run: self.stops.get(run) for run in runs}
        return {run: d for run, d in found.items() if d is not None}
