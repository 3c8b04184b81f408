"""Finding the service and its aggregators in a namespace, or starting them when none run.

``get_if_exists`` makes concurrent starts from many ranks race-free; the process that started
the service owns it and shuts it down at exit (unless it is detached).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from rlmon.actors.aggregator_actor import aggregator_actor_class
from rlmon.actors.runtime.at_exit import hook_exit
from rlmon.actors.runtime.connect import connect_ray
from rlmon.actors.runtime.console import announce, relay_console
from rlmon.actors.runtime.held import (
    LOCK,
    PROCESS,
    RUNTIMES,
    Runtime,
    get_actor,
    in_ray_worker,
    runtime_of,
)
from rlmon.actors.runtime.names import SERVICE, aggregator_name, node_merger_name
from rlmon.actors.runtime.options import RuntimeOptions
from rlmon.actors.service_actor import service_actor_class

if TYPE_CHECKING:
    from rlmon.service.config import Settings

__all__ = ["ensure_runtime", "metrics_url", "node_merger"]


def ensure_runtime(namespace: str = "rlmon", options: RuntimeOptions | None = None) -> Any:
    """The service handle; starts the service and its aggregators when they are not running.

    Any number of calls, from any number of Reporters of a process, share one runtime per
    namespace (see :class:`~rlmon.actors.runtime.held.Runtime`). Started from a driver, the
    actors live as long as that driver (or for ever with ``detached``), and the driver finalizes
    and delivers everything at exit. Started from inside a Ray worker (a Reporter in a policy
    rank), they are detached, so the death of that one rank does not take monitoring down with it.
    """
    import ray

    with LOCK:
        known = RUNTIMES.get(namespace)
        if known is not None:
            return known.service
        opts = options or RuntimeOptions()
        resolved: list[Settings] = []

        def settings() -> Settings:
            # resolved when something is started (or the caller gave them): a Reporter joining
            # a running service never needs its own process's settings
            if not resolved:
                resolved.append(opts.resolved_settings())
            return resolved[0]

        connect_ray(namespace, opts.address)
        hook_exit()
        detached = opts.detached or in_ray_worker()
        lifetime = "detached" if detached else None
        state_dir = opts.resolved_state_dir(namespace)
        service = get_actor(SERVICE, namespace)
        cls = aggregator_actor_class()
        aggregators: list[Any] = []

        def start_aggregators(shards: int) -> None:
            for shard in range(len(aggregators), shards):
                agg = get_actor(aggregator_name(shard), namespace)
                if agg is None:
                    agg = cls.options(
                        name=aggregator_name(shard), namespace=namespace, get_if_exists=True,
                        lifetime=lifetime, max_restarts=opts.max_restarts,
                    ).remote(namespace, SERVICE, shard, state_dir, opts.deadline_s, opts.tick_s,
                             settings().liveness.params())
                aggregators.append(agg)

        if service is None:
            extra: dict[str, Any] = {}
            if opts.service_resource:
                extra["resources"] = {opts.service_resource: 1.0}
            service = service_actor_class().options(
                name=SERVICE, namespace=namespace, get_if_exists=True, lifetime=lifetime,
                max_restarts=opts.max_restarts, **extra,
            ).remote(settings(), state_dir, opts.port, opts.host or None,
                     opts.shards, opts.rules, PROCESS)
            # the aggregators' workers start beside the service's, not after it is up (each
            # worker's start-up is seconds on a busy machine; one after the other doubled it)
            start_aggregators(opts.shards)
        layout: Any = ray.get(service.layout.remote())
        if opts.settings is not None and layout.get("creator") != PROCESS and not ray.get(
                service.settings_match.remote(settings())):
            raise RuntimeError(
                f"an rlmon service already runs in namespace {namespace!r} with other settings "
                "(token, public_url, notifiers, ...): its settings cannot be changed in place; "
                "stop it first, or start this one in another namespace")
        start_aggregators(int(layout["shards"]))  # a service found running says how many
        del aggregators[int(layout["shards"]):]
        # the aggregators up before the first send: a call to one whose worker is still starting
        # (seconds on a busy machine) would time out and be resent, with a misleading last error
        ray.get([agg.__ray_ready__.remote() for agg in aggregators])
        owned = layout.get("creator") == PROCESS
        runtime = RUNTIMES[namespace] = Runtime(
            namespace, service, aggregators, layout.get("port"), layout.get("host"), owned,
            detached)
        if owned:
            announce(runtime, layout)
            if not in_ray_worker():
                # A Ray worker's output reaches the driver through Ray's lagging forwarding and
                # is lost when Ray stops first: there the lines wait for shutdown_runtime, which
                # the driver calls before its ray.shutdown() and which prints them itself.
                threading.Thread(target=relay_console, args=(runtime,), daemon=True,
                                 name="rlmon-console").start()
        return service


def metrics_url(namespace: str = "rlmon", timeout: float = 10.0) -> str | None:
    """Where the namespace's ``/metrics`` is served; None when no service runs (this process
    connected to Ray and none was found) or its exporter is disabled."""
    runtime = runtime_of(namespace)
    if runtime is not None:
        port, host = runtime.port, runtime.host
    else:
        import ray

        service = get_actor(SERVICE, namespace) if ray.is_initialized() else None
        if service is None:
            return None
        layout: Any = ray.get(service.layout.remote(), timeout=timeout)
        port, host = layout.get("port"), layout.get("host")
    return None if port is None else f"http://{host}:{port}/metrics"


def node_merger(namespace: str, shard: int, options: RuntimeOptions) -> Any:
    """The node merger of this node for one aggregator shard (started on this node if missing)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from rlmon.actors.node_merger import node_merger_actor_class

    node = ray.get_runtime_context().get_node_id()
    name = node_merger_name(shard, node)
    with LOCK:
        runtime = RUNTIMES[namespace]
        handle = runtime.node_mergers.get(name) or get_actor(name, namespace)
        if handle is None:
            handle = node_merger_actor_class().options(
                name=name, namespace=namespace, get_if_exists=True,
                lifetime="detached" if runtime.detached else None,
                max_restarts=options.max_restarts,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
            ).remote(namespace, aggregator_name(shard), options.tick_s)
        runtime.node_mergers[name] = handle
        return handle
