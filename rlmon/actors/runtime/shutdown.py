"""Stopping a namespace's runtime gracefully: aggregators finalize and deliver, the service
drains its outbox, then the actors are killed."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from rlmon.actors.runtime.console import print_console
from rlmon.actors.runtime.held import LOCK, RUNTIMES, get_actor
from rlmon.actors.runtime.names import SERVICE, aggregator_name
from rlmon.actors.runtime.no_auto_init import no_auto_init

__all__ = ["shutdown_runtime"]


def shutdown_runtime(namespace: str = "rlmon", timeout: float = 10.0, kill: bool = True,
                     deadline: float | None = None) -> bool:
    """Graceful stop: aggregators finalize and deliver, the service drains its outbox; then kill.

    ``deadline`` (monotonic) bounds every wait (the exit flush's budget). Returns whether
    everything was delivered in time.
    """
    import ray

    def cap(wait: float) -> float:
        return wait if deadline is None else max(0.0, min(wait, deadline - time.monotonic()))

    if not ray.is_initialized():
        return False
    with no_auto_init():  # Ray shut down mid-way (by the script): a call fails, never restarts it
        return _stop(namespace, timeout, kill, cap)


def _stop(namespace: str, timeout: float, kill: bool, cap: Callable[[float], float]) -> bool:
    import ray

    with LOCK:
        runtime = RUNTIMES.pop(namespace, None)
    ok = True
    try:
        service = runtime.service if runtime is not None else ray.get_actor(
            SERVICE, namespace=namespace)
        layout: Any = ray.get(service.layout.remote(), timeout=cap(timeout))
        shards = int(layout["shards"])
    except Exception:
        return False
    for handle in (runtime.node_mergers.values() if runtime is not None else ()):
        try:  # hand the node merger's pre-merged states to the root first
            ray.get(handle.flush.remote(), timeout=cap(timeout))
        except Exception:
            ok = False
        if kill:
            ray.kill(handle, no_restart=True)
    for shard in range(shards):
        agg = runtime.aggregators[shard] if runtime is not None and shard < len(
            runtime.aggregators) else get_actor(aggregator_name(shard), namespace)
        if agg is None:
            continue
        try:  # its close publishes (10 s bound) and joins its thread (5 s) inside this wait
            ok = bool(ray.get(agg.close.remote(), timeout=cap(timeout + 20))) and ok
        except Exception:
            ok = False
        if kill:
            ray.kill(agg, no_restart=True)
    try:
        ok = bool(ray.get(service.close.remote(timeout), timeout=cap(timeout + 5))) and ok
        print_console(service, cap(timeout))  # the alerts of the last steps, before Ray stops
    except Exception:
        ok = False
    if kill:
        ray.kill(service, no_restart=True)
    return ok
