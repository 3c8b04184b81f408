"""The Aggregator actor: an :class:`AggregatorCore` behind a named, restartable Ray actor.

A delivery thread hands finalized records to the service (at once when a step finishes, and at
least every ``tick_s``) and finalizes steps whose deadline passed. The watermark and the record
outbox live in SQLite under ``state_dir`` (next to the history store), so a restarted actor
(``max_restarts``) finalizes nothing twice and loses nothing it had finalized; open steps are
rebuilt from the reporters' resends.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

from rlmon.actors.aggregation import AggregatorCore, IngestAck
from rlmon.actors.deadline import DeadlinePolicy
from rlmon.actors.message import StepMessage
from rlmon.service.assembly import StepState
from rlmon.service.watermark import WatermarkStore

__all__ = ["aggregator_actor_class"]

log = logging.getLogger(__name__)

# Counters that can change while no step finalizes; a change is published on its own.
_SAID_WITHOUT_A_STEP = ("late", "rejected", "duplicates", "restarts", "reporter_dropped")


class AggregatorServer:
    """What the actor does, with the service handle injected (a Protocol seam for tests)."""

    def __init__(
        self, core: AggregatorCore, publish: Any, shard: int = 0, tick_s: float = 0.02,
    ) -> None:
        self.core, self.publish, self.shard, self.tick_s = core, publish, shard, tick_s
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.delivery_errors = 0
        self._published_stats: dict[str, Any] | None = None
        self._delivering = threading.Lock()  # the loop and close() never publish the same records
        self._thread = threading.Thread(target=self._loop, daemon=True, name="rlmon-aggregator")
        self._thread.start()

    def ingest(self, messages: list[StepMessage]) -> IngestAck:
        ack = self.core.ingest(messages)
        if ack.finalized:
            self._wake.set()
        return ack

    def merge_states(
        self, states: list[StepState], source: tuple[str, int] | None = None,
    ) -> IngestAck:
        ack = self.core.merge_states(states, source)
        if ack.finalized:
            self._wake.set()
        return ack

    def deliver(self) -> bool:
        """Hand pending records to the service; True when nothing is left undelivered."""
        with self._delivering:
            return self._deliver()

    def _deliver(self) -> bool:
        records = self.core.pending_records()
        stats = self.core.stats()
        counts = {k: stats[k] for k in _SAID_WITHOUT_A_STEP}
        if not records and counts == self._published_stats:
            return True
        try:
            # counters changed without a step (late or rejected records): /metrics shows them now
            self.publish(records, self.shard, stats)
            self._published_stats = counts
        except Exception as exc:  # the service is restarting: keep the records, retry
            self.delivery_errors += 1
            log.warning("delivery to the service failed: %s", exc)
            return False
        self.core.delivered(records)
        return not self.core.pending_records(1)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.tick_s)
            self._wake.clear()
            try:
                self.core.tick()
                while not self.deliver():
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
        self._thread.join(5.0)
        return ok


def aggregator_actor_class() -> Any:
    """The Ray actor class (defined lazily so that importing this module does not import Ray)."""
    import ray

    remote: Any = ray.remote

    @remote(num_cpus=0, max_concurrency=4)
    class AggregatorActor:
        def __init__(
            self, namespace: str, service_name: str, shard: int, state_dir: str | None,
            deadline_s: float | None = None, tick_s: float = 0.02,
        ) -> None:
            store = None
            if state_dir is not None:
                store = WatermarkStore(Path(state_dir) / f"watermark-{shard}.sqlite")
            core = AggregatorCore(deadline=DeadlinePolicy(fixed=deadline_s), store=store)
            self.namespace, self.service_name = namespace, service_name
            self._service: Any = None
            self.server = AggregatorServer(core, self._publish, shard, tick_s)

        def _publish(self, records: list[Any], shard: int, stats: dict[str, Any]) -> None:
            if self._service is None:
                self._service = ray.get_actor(self.service_name, namespace=self.namespace)
            try:
                ray.get(self._service.publish.remote(records, shard, stats), timeout=10)
            except Exception:
                self._service = None
                raise

        def ingest(self, messages: list[StepMessage]) -> IngestAck:
            return self.server.ingest(messages)

        def probe(self, run: str, role: str) -> IngestAck:
            return self.server.core.probe(run, role)

        def merge_states(
            self, states: list[StepState], source: tuple[str, int] | None = None,
        ) -> IngestAck:
            return self.server.merge_states(states, source)

        def stats(self) -> dict[str, Any]:
            return {**self.server.core.stats(), "delivery_errors": self.server.delivery_errors}

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
