"""The optional per-node collector tier: pre-merge the node's step messages, forward step states.

Partials are associative and commutative, so merging a node's ranks first and the nodes' states
at the root gives the same result as merging every rank at the root
(``tests/test_aggregator_tier.py``). The root then receives one state per node and step instead
of one message per rank. A collector never finalizes: it does not know the world, only its ranks.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

from rlmon.actors.columnar import StepBlock, fold_block
from rlmon.actors.message import Schema, StepMessage
from rlmon.service.assembly import StepState
from rlmon.service.rank import Rank
from rlmon.service.report import Report
from rlmon.service.step import StepKey

__all__ = ["Collector", "collector_actor_class"]


class Collector:
    """Pre-merges messages into :class:`StepState` s; :meth:`drain` hands them on."""

    def __init__(self, remember: int = 4096) -> None:
        self.states: dict[StepKey, StepState] = {}
        self.blocks: dict[StepKey, StepBlock] = {}
        self.schemas: dict[int, Schema] = {}
        self.remember = remember
        self._seen: dict[tuple[str, str, Rank], deque[int]] = {}
        self.duplicates = 0
        self.lock = threading.Lock()

    def add(self, msg: StepMessage) -> bool:
        """Fold one message in; False for a resend of a message already taken."""
        with self.lock:
            seen = self._seen.setdefault((msg.run, msg.role, msg.rank), deque(maxlen=self.remember))
            if msg.seq in seen:
                self.duplicates += 1
                return False
            seen.append(msg.seq)
            key = (msg.run, msg.role, msg.step)
            state = self.states.get(key)
            if state is None:
                state = self.states[key] = StepState(msg.run, msg.role, msg.step, msg.world)
            if msg.columns is not None:
                schema = self.schemas.setdefault(msg.columns.schema.id, msg.columns.schema)
                block = self.blocks.get(key)
                if block is None:
                    self.blocks[key] = StepBlock(schema, msg.columns.values)
                else:
                    block.merge(schema, msg.columns.values)
            for mb, partials in msg.partials:
                state.add(Report(msg.run, msg.role, msg.step, partials, msg.rank, msg.world,
                                 final=False, minibatch=mb, time=msg.time))
            state.add(Report(msg.run, msg.role, msg.step, {}, msg.rank, msg.world,
                             seq=msg.seq, time=msg.time))
            return True

    def drain(self) -> list[StepState]:
        """Every pre-merged state since the last drain."""
        with self.lock:
            states, self.states = self.states, {}
            blocks, self.blocks = self.blocks, {}
        for key, block in blocks.items():
            fold_block(states[key].pools, block)
        return [states[key] for key in sorted(states)]


def collector_actor_class() -> Any:
    """A Ray actor around :class:`Collector` forwarding to the root aggregator every ``tick_s``."""
    import ray

    remote: Any = ray.remote

    @remote(num_cpus=0, max_concurrency=2)
    class CollectorActor:
        def __init__(self, namespace: str, aggregator: str, tick_s: float = 0.02) -> None:
            self.collector = Collector()
            self.namespace, self.aggregator, self.tick_s = namespace, aggregator, tick_s
            self._stop = threading.Event()
            self._held: list[StepState] = []
            threading.Thread(target=self._loop, daemon=True).start()

        def ingest(self, messages: list[StepMessage]) -> int:
            return sum(self.collector.add(m) for m in messages)

        def _forward(self) -> None:
            self._held.extend(self.collector.drain())
            if self._held:
                root = ray.get_actor(self.aggregator, namespace=self.namespace)
                ray.get(root.merge_states.remote(self._held), timeout=10)
                self._held = []

        def _loop(self) -> None:
            while not self._stop.wait(self.tick_s):
                try:
                    self._forward()
                except Exception:  # the root is restarting: keep the states, retry
                    self._stop.wait(0.2)

        def flush(self) -> bool:
            self._forward()
            return True

    return CollectorActor
