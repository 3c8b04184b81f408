"""The per-node merge tier as a Ray actor: a :class:`~rlmon.service.aggregation.node_merge.NodeMerger` that
forwards its pre-merged step states to the root aggregator."""

from __future__ import annotations

import threading
import time
from typing import Any

from rlmon.service.aggregation.node_merge import NodeMerger
from rlmon.service.aggregation.tier_messages import NodeBatch
from rlmon.service.contract.acks import IngestAck
from rlmon.service.contract.step_message import StepMessage

__all__ = ["node_merger_actor_class"]


def node_merger_actor_class() -> Any:
    """A Ray actor around :class:`NodeMerger` forwarding to the root aggregator every ``tick_s``."""
    import ray

    remote: Any = ray.remote

    @remote(num_cpus=0, max_concurrency=2)
    class NodeMergerActor:
        def __init__(self, namespace: str, aggregator: str, tick_s: float = 0.02) -> None:
            self.merger = NodeMerger()
            self.namespace, self.aggregator, self.tick_s = namespace, aggregator, tick_s
            self._stop = threading.Event()
            self._batches: list[NodeBatch] = []
            self._forward_lock = threading.Lock()
            self._next_probe = 0.0
            threading.Thread(target=self._loop, daemon=True).start()

        def ingest(self, messages: list[StepMessage]) -> IngestAck:
            return self.merger.ingest(messages)

        def probe(self, run: str, role: str) -> IngestAck:
            return self.merger.probe(run, role)

        def _root(self) -> Any:
            return ray.get_actor(self.aggregator, namespace=self.namespace)

        def _forward(self) -> None:
            with self._forward_lock:
                batch = self.merger.next_batch()
                if batch is not None:
                    self._batches.append(batch)
                while self._batches:  # in order; a retried batch keeps its (id, seq)
                    ack = ray.get(self._root().merge_batch.remote(self._batches[0]), timeout=10)
                    self.merger.merged(self._batches[0], ack)
                    self._batches.pop(0)
                if time.monotonic() >= self._next_probe:  # learn of a root restart while idle
                    self.merger.learn(ray.get(self._root().merge_batch.remote(NodeBatch([])),
                                              timeout=10))
                    self._next_probe = time.monotonic() + 0.5

        def _loop(self) -> None:
            while not self._stop.wait(self.tick_s):
                try:
                    self._forward()
                except Exception:  # the root is restarting: keep the batches, retry
                    self._stop.wait(0.2)

        def flush(self) -> bool:
            self._forward()
            return True

    return NodeMergerActor
