"""Finding or starting rlmon's actors on a Ray cluster, and the Reporter's Ray sink.

Actors are named in the namespace given to the Reporter (``rlmon`` by default): the service
``rlmon-service`` and one aggregator per shard, ``rlmon-aggregator-<i>``. A (run, role) always
maps to the same shard. ``get_if_exists`` makes concurrent starts from many ranks race-free.
"""

from __future__ import annotations

import os
import re
import tempfile
import threading
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rlmon.actors.aggregation import IngestAck
from rlmon.actors.aggregator import aggregator_actor_class
from rlmon.actors.message import StepMessage
from rlmon.actors.service import service_actor_class

__all__ = [
    "AGGREGATOR",
    "SERVICE",
    "RaySink",
    "RuntimeOptions",
    "aggregator_name",
    "default_state_dir",
    "ensure_runtime",
    "node_collector",
    "shard_of",
    "shutdown_runtime",
]

SERVICE = "rlmon-service"
AGGREGATOR = "rlmon-aggregator"


def aggregator_name(shard: int) -> str:
    return f"{AGGREGATOR}-{shard}"


def shard_of(run: str, role: str, shards: int) -> int:
    """The aggregator shard of a (run, role): stable across processes and restarts."""
    return zlib.crc32(f"{run}\0{role}".encode()) % max(shards, 1)


@dataclass(frozen=True, slots=True)
class RuntimeOptions:
    """How to start the service and aggregators when none are running (embedded defaults)."""

    config: str | None = None
    rules: str | None = None
    state_dir: str | None = None  # default: default_state_dir(namespace)
    port: int | None = None  # exporter port; None: RLMON_PORT or no HTTP server
    host: str = "127.0.0.1"
    shards: int = 1
    detached: bool = False
    max_restarts: int = -1
    deadline_s: float | None = None  # None: derived from the observed step period
    tick_s: float = 0.02
    collectors: bool = False  # Reporters send to a per-node collector that pre-merges

    def resolved_state_dir(self, namespace: str) -> str:
        return self.state_dir or os.environ.get("RLMON_STATE_DIR") or default_state_dir(namespace)


def default_state_dir(namespace: str) -> str:
    """A per-user, private (0700) directory: ``$XDG_STATE_HOME/rlmon/<namespace>`` (default
    ``~/.local/state``), never a shared, guessable path under /tmp that another user could plant
    files in. Without a usable home, a fresh ``mkdtemp`` directory (the state is then ephemeral).
    """
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local",
                                                            "state")
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", namespace).strip(".") or "_"
    path = os.path.join(base, "rlmon", safe)
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.stat(path)
        if st.st_uid != os.getuid():
            raise PermissionError(f"{path} belongs to another user")
        if st.st_mode & 0o077:
            os.chmod(path, 0o700)
        return path
    except OSError:
        return tempfile.mkdtemp(prefix=f"rlmon-{namespace}-")


# Handles of the actors this process created: a non-detached actor lives while its creator holds a
# handle, so the creating process (the driver of `rlmon demo`, `rlmon serve`, a training script)
# keeps them until it exits.
_OWNED: dict[tuple[str, str], Any] = {}


def _in_ray_worker() -> bool:
    import ray

    return bool(ray.get_runtime_context().worker.mode == ray.WORKER_MODE)


def ensure_runtime(namespace: str = "rlmon", options: RuntimeOptions | None = None) -> Any:
    """The service handle; starts the service and its aggregators when they are not running.

    Started from a driver, the actors live as long as that driver (or for ever with
    ``detached``). Started from inside a Ray worker (a Reporter in a policy rank), they are
    detached, so the death of that one rank does not take monitoring down with it.
    """
    import ray

    opts = options or RuntimeOptions()
    if not ray.is_initialized():
        ray.init(namespace=namespace, include_dashboard=False, log_to_driver=True)
    lifetime = "detached" if opts.detached or _in_ray_worker() else None
    state_dir = opts.resolved_state_dir(namespace)
    port = opts.port
    if port is None and os.environ.get("RLMON_PORT"):
        port = int(os.environ["RLMON_PORT"])
    service = service_actor_class().options(
        name=SERVICE, namespace=namespace, get_if_exists=True, lifetime=lifetime,
        max_restarts=opts.max_restarts,
    ).remote(opts.config, state_dir, port, opts.host, opts.shards, opts.rules)
    _OWNED[(namespace, SERVICE)] = service
    layout: Any = ray.get(service.layout.remote())
    shards = int(layout["shards"])
    cls = aggregator_actor_class()
    for shard in range(shards):
        _OWNED[(namespace, aggregator_name(shard))] = cls.options(
            name=aggregator_name(shard), namespace=namespace, get_if_exists=True,
            lifetime=lifetime, max_restarts=opts.max_restarts,
        ).remote(namespace, SERVICE, shard, state_dir, opts.deadline_s, opts.tick_s)
    return service


def node_collector(namespace: str, shard: int, options: RuntimeOptions) -> Any:
    """The collector of this node for one aggregator shard (started on this node if missing)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from rlmon.actors.collector import collector_actor_class

    node = ray.get_runtime_context().get_node_id()
    name = f"rlmon-collector-{shard}-{node[:16]}"
    handle = collector_actor_class().options(
        name=name, namespace=namespace, get_if_exists=True,
        lifetime="detached" if options.detached or _in_ray_worker() else None,
        max_restarts=options.max_restarts,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
    ).remote(namespace, aggregator_name(shard), options.tick_s)
    _OWNED[(namespace, name)] = handle
    return handle


class RaySink:
    """Sends step messages to the aggregator shard of their (run, role) and waits for the ack.

    It runs on the Reporter's sender thread, never on the training thread. A failed call (the
    actor restarting or gone) raises, the Reporter keeps the messages, and the next call looks the
    actor up again.
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
        self.last_ack: IngestAck | None = None
        if start_service:
            service = ensure_runtime(namespace, options)
            import ray

            layout: Any = ray.get(service.layout.remote())
            self._shards = int(layout["shards"])

    def _shard_count(self) -> int:
        if self._shards is None:
            import ray

            service = ray.get_actor(SERVICE, namespace=self.namespace)
            layout: Any = ray.get(service.layout.remote())
            self._shards = int(layout["shards"])
        return self._shards

    def _handle(self, shard: int) -> Any:
        handle = self._handles.get(shard)
        if handle is None:
            if self.options is not None and self.options.collectors:
                handle = self._handles[shard] = node_collector(
                    self.namespace, shard, self.options)
            else:
                import ray

                handle = self._handles[shard] = ray.get_actor(
                    aggregator_name(shard), namespace=self.namespace)
        return handle

    def probe(self, run: str, role: str) -> IngestAck | None:
        """The incarnation and floor of the aggregator (or collector) serving (run, role)."""
        import ray

        with self._lock:
            shard = shard_of(run, role, self._shard_count())
            try:
                ack: IngestAck = ray.get(
                    self._handle(shard).probe.remote(run, role), timeout=self.timeout)
            except Exception:
                self._handles.pop(shard, None)
                raise
            return ack

    def send(self, messages: Sequence[StepMessage]) -> IngestAck | None:
        import ray

        with self._lock:
            shards = self._shard_count()
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


def shutdown_runtime(namespace: str = "rlmon", timeout: float = 10.0, kill: bool = True) -> bool:
    """Graceful stop: aggregators finalize and deliver, the service drains its outbox; then kill.

    Returns whether everything was delivered in time.
    """
    import ray

    ok = True
    try:
        service = ray.get_actor(SERVICE, namespace=namespace)
        layout: Any = ray.get(service.layout.remote(), timeout=timeout)
        shards = int(layout["shards"])
    except Exception:
        return False
    for (ns, name), handle in list(_OWNED.items()):
        if ns == namespace and name.startswith("rlmon-collector-"):
            try:  # hand the collector's pre-merged states to the root first
                ray.get(handle.flush.remote(), timeout=timeout)
            except Exception:
                ok = False
            if kill:
                ray.kill(handle, no_restart=True)
    for shard in range(shards):
        try:
            agg = ray.get_actor(aggregator_name(shard), namespace=namespace)
        except ValueError:
            continue
        try:
            ok = bool(ray.get(agg.close.remote(), timeout=timeout)) and ok
        except Exception:
            ok = False
        if kill:
            ray.kill(agg, no_restart=True)
    try:
        ok = bool(ray.get(service.close.remote(timeout), timeout=timeout + 5)) and ok
    except Exception:
        ok = False
    if kill:
        ray.kill(service, no_restart=True)
    for key in [k for k in _OWNED if k[0] == namespace]:
        del _OWNED[key]
    return ok
