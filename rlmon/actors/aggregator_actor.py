"""The Aggregator actor: an :class:`~rlmon.service.aggregation.aggregator.AggregatorServer` behind a named,
restartable Ray actor.

Its delivery thread hands finalized records to the service (at once when a step finishes, and at
least every ``tick_s``) and finalizes steps whose deadline passed. The watermark and the record
outbox live in SQLite under ``state_dir`` (next to the history store), so a restarted actor
(``max_restarts``) finalizes nothing twice and loses nothing it had finalized; open steps are
rebuilt from the reporters' resends.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

from rlmon.actors.process_probe import RayProcessProbe
from rlmon.service.aggregation.aggregator import AggregatorCore, AggregatorServer
from rlmon.service.aggregation.aggregator_stats import AggregatorStats
from rlmon.service.aggregation.deadline import DeadlinePolicy
from rlmon.service.aggregation.tier_messages import NodeBatch
from rlmon.service.aggregation.watermark import WatermarkStore
from rlmon.service.contract.acks import IngestAck
from rlmon.service.contract.heartbeat import Heartbeat
from rlmon.service.contract.step_message import StepMessage
from rlmon.service.contract.stop_decision import StopDecision
from rlmon.service.liveness.run_state import LivenessView
from rlmon.service.liveness.thresholds import LivenessParams

__all__ = ["aggregator_actor_class"]

log = logging.getLogger(__name__)

def aggregator_actor_class() -> Any:
    """The Ray actor class (defined lazily so that importing this module does not import Ray)."""
    import ray

    remote: Any = ray.remote

    @remote(num_cpus=0, max_concurrency=4)
    class AggregatorActor:
        def __init__(
            self, namespace: str, service_name: str, shard: int, state_dir: str | None,
            deadline_s: float | None = None, tick_s: float = 0.02,
            liveness: LivenessParams | None = None,
        ) -> None:
            store = None
            if state_dir is not None:
                store = WatermarkStore(Path(state_dir) / f"watermark-{shard}.sqlite")
            core = AggregatorCore(deadline=DeadlinePolicy(fixed=deadline_s), store=store,
                                  liveness=liveness)
            # before a silent run is called dead: Ray's knowledge of its driver and actors
            core.liveness.probe = RayProcessProbe()
            self.namespace, self.service_name = namespace, service_name
            self._service: Any = None
            self.server = AggregatorServer(core, self._publish, shard, tick_s,
                                           publish_liveness=self._publish_liveness).start()

        def _publish_liveness(self, views: list[LivenessView], shard: int) -> None:
            if self._service is None:
                self._service = ray.get_actor(self.service_name, namespace=self.namespace)
            try:
                ray.get(self._service.liveness.remote(views, shard), timeout=10)
            except Exception:
                self._service = None
                raise

        def heartbeat(self, beats: list[Heartbeat]) -> IngestAck:
            """Heartbeats sent on their own (no step message was due)."""
            return self.server.heartbeat(beats)

        def finish_run(self, run: str) -> None:
            self.server.core.finish_run(run)

        def _publish(self, records: list[Any], shard: int, stats: AggregatorStats,
                     ) -> dict[str, StopDecision]:
            if self._service is None:
                self._service = ray.get_actor(self.service_name, namespace=self.namespace)
            try:
                stops: dict[str, StopDecision] = ray.get(
                    self._service.publish.remote(records, shard, stats), timeout=10)
                return stops
            except Exception:
                self._service = None
                raise

        def ingest(self, messages: list[StepMessage]) -> IngestAck:
            return self.server.ingest(messages)

        def probe(self, run: str, role: str) -> IngestAck:
            return self.server.core.probe(run, role)

        def merge_batch(self, batch: NodeBatch) -> IngestAck:
            return self.server.merge_batch(batch)

        def stats(self) -> AggregatorStats:
            return replace(self.server.core.stats(), delivery_errors=self.server.delivery_errors)

        def flush(self, timeout: float = 5.0) -> bool:
            """Deliver every finalized record now (without finalizing open steps)."""
            import time

            deadline = time.monotonic() + timeout
            while not self.server.deliver():
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.05)
            return True

        def close(self) -> bool:
            """Finalize every open step, deliver, stop (graceful shutdown)."""
            return self.server.close(finalize=True)

        def ping(self) -> bool:
            return True

    return AggregatorActor
