"""The Reporter's Ray sink: step messages and heartbeats to the aggregator shard of their
(run, role), from the Reporter's sender thread.

It lives in the runtime rather than beside the sink protocol and the Ray-free sinks
(:mod:`rlmon.actors.reporter.sink`) because it imports Ray and drives the runtime; the Reporter
gets it through :func:`rlmon.actors.reporter.sink.default_sink` only when no sink is given.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from rlmon.actors.runtime.at_exit import hook_exit
from rlmon.actors.runtime.connect import connect_ray, not_connected, ray_address
from rlmon.actors.runtime.console import say_service
from rlmon.actors.runtime.held import FLUSHED
from rlmon.actors.runtime.names import SERVICE, aggregator_name, shard_of
from rlmon.actors.runtime.no_auto_init import no_auto_init
from rlmon.actors.runtime.options import RuntimeOptions
from rlmon.actors.runtime.start import ensure_runtime, node_merger
from rlmon.service.contract.acks import IngestAck
from rlmon.service.contract.heartbeat import Heartbeat
from rlmon.service.contract.step_message import StepMessage

__all__ = ["RaySink"]


class RaySink:
    """Sends step messages to the aggregator shard of their (run, role) and waits for the ack.

    It runs on the Reporter's sender thread, never on the training thread: the first send starts
    (or finds) Ray and the runtime there, so creating a Reporter and recording never wait for
    Ray. A failed call (the actor restarting or gone) raises, the Reporter keeps the messages,
    and the next call looks the actor up again.
    :class:`~rlmon.actors.runtime.held.RuntimeGone` means Ray was shut down for good in this
    process.
    """

    def __init__(
        self, namespace: str = "rlmon", *, start_service: bool = True,
        options: RuntimeOptions | None = None, timeout: float = 10.0,
    ) -> None:
        self.namespace, self.start_service = namespace, start_service
        self.options, self.timeout = options, timeout
        self._handles: dict[int, Any] = {}
        self._shards: int | None = None
        self._lock = threading.Lock()
        self._calls: list[tuple[str, tuple[Any, ...]]] = []  # service calls made before connect
        self._service: Any = None
        self.last_ack: IngestAck | None = None
        self.heartbeat_seconds: float | None = None  # the service's period, once connected
        hook_exit()

    def _connect(self) -> None:
        """Find (or start) the runtime; called with the lock held, on the sender thread."""
        if self._shards is not None:
            connect_ray(self.namespace)  # raises RuntimeGone after a shutdown
            return
        import ray

        if self.start_service:
            self._service = ensure_runtime(self.namespace, self.options)
        else:
            connect_ray(self.namespace)
            self._service = ray.get_actor(SERVICE, namespace=self.namespace)
        layout: Any = ray.get(self._service.layout.remote(), timeout=self.timeout)
        self._shards = int(layout["shards"])
        period = layout.get("heartbeat_seconds")  # absent from a service older than this sink
        self.heartbeat_seconds = float(period) if period else None
        say_service(self.namespace, layout)
        calls, self._calls = self._calls, []
        for method, args in calls:
            getattr(self._service, method).remote(*args)

    @contextlib.contextmanager
    def _held(self) -> Iterator[None]:
        """The sink's lock, waited for no longer than a call: a call stuck inside Ray (one in
        flight when the user's ray.shutdown() tore the worker down) must not hold the next
        caller for ever; at exit, the closing heartbeat waited on it, and the process never
        exited."""
        if not self._lock.acquire(timeout=self.timeout):
            raise TimeoutError(f"an earlier call to Ray is still in progress after "
                               f"{self.timeout:g}s")
        try:
            yield
        finally:
            self._lock.release()

    @contextlib.contextmanager
    def _connected(self) -> Iterator[int]:
        """The sink's lock held and Ray connected (started by the first call); the calls made
        inside run with Ray's auto-init off (:mod:`~rlmon.actors.runtime.no_auto_init`: a
        shutdown landing mid-call fails it, never starts Ray again). Yields the shard count."""
        with self._held():
            self._connect()
            assert self._shards is not None
            with no_auto_init():
                yield self._shards

    def undelivered(self) -> str | None:
        """Why messages are still held when the Reporter closes, when the sink knows better than
        its last error: Ray was still starting (or being reached) as the exit budget ran out."""
        if self._shards is not None or not FLUSHED.locked():  # not in the exit flush
            return None
        initialized = getattr(sys.modules.get("ray"), "is_initialized", None)  # maybe mid-import
        if initialized is not None and initialized():
            return None
        target, source = ray_address(self.options.address if self.options else None)
        return not_connected(target, source, None, at_exit=True)

    def call_service(self, method: str, *args: Any) -> None:
        """Call a service method without waiting; before the first send it is queued, so the
        training thread never starts Ray."""
        with self._lock:
            if self._service is None:
                self._calls.append((method, args))
                return
            service = self._service
        with no_auto_init():
            getattr(service, method).remote(*args)

    def _handle(self, shard: int) -> Any:
        handle = self._handles.get(shard)
        if handle is None:
            if self.options is not None and self.options.node_merge:
                handle = self._handles[shard] = node_merger(
                    self.namespace, shard, self.options)
            else:
                import ray

                handle = self._handles[shard] = ray.get_actor(
                    aggregator_name(shard), namespace=self.namespace)
        return handle

    def probe(self, run: str, role: str) -> IngestAck | None:
        """The incarnation and floor of the aggregator (or node merger) serving (run, role)."""
        import ray

        with self._connected() as shards:
            shard = shard_of(run, role, shards)
            try:
                ack: IngestAck = ray.get(
                    self._handle(shard).probe.remote(run, role), timeout=self.timeout)
            except Exception:
                self._handles.pop(shard, None)
                raise
            return ack

    def heartbeat(self, beats: Sequence[Heartbeat]) -> None:
        """Heartbeats sent alone, to the aggregator shard of each (run, role) (a node merger
        is bypassed: liveness is judged by the root)."""
        import ray

        with self._connected() as shards:
            by_shard: dict[int, list[Heartbeat]] = {}
            for beat in beats:
                by_shard.setdefault(shard_of(beat.run, beat.role, shards), []).append(beat)
            for shard, batch in by_shard.items():
                handle = ray.get_actor(aggregator_name(shard), namespace=self.namespace)
                ray.get(handle.heartbeat.remote(batch), timeout=self.timeout)

    def send(self, messages: Sequence[StepMessage]) -> IngestAck | None:
        import ray

        with self._connected() as shards:
            by_shard: dict[int, list[StepMessage]] = {}
            for msg in messages:
                by_shard.setdefault(shard_of(msg.run, msg.role, shards), []).append(msg)
            for shard, batch in by_shard.items():
                try:
                    self.last_ack = ray.get(
                        self._handle(shard).ingest.remote(batch), timeout=self.timeout)
                except Exception:
                    self._handles.pop(shard, None)
                    raise
            return self.last_ack
