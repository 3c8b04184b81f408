"""What this process holds of rlmon on Ray: one runtime per namespace, and how far its exit has
gone. Shared by the modules that start, join, flush and shut down a runtime; one lock guards it.
"""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass, field
from typing import Any

from rlmon.actors.reporter.sink import SinkClosed

__all__ = ["EXITING", "FLUSHED", "LOCK", "PROCESS", "RUNTIMES", "STATE", "ProcessState",
           "Runtime", "RuntimeGone", "get_actor", "in_ray_worker", "runtime_of"]


@dataclass(slots=True)
class Runtime:
    """The handles this process holds on one namespace's service and aggregators.

    Kept in :data:`RUNTIMES` for the life of the process and never replaced: a non-detached
    actor lives while its creator holds the handle it got at creation, so dropping or
    overwriting that handle would kill the actor under every other Reporter of the process.
    """

    namespace: str
    service: Any
    aggregators: list[Any]
    port: int | None
    host: str | None
    owned: bool  # this process started the service: it shuts the runtime down at exit
    detached: bool
    node_mergers: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class ProcessState:
    """Where this process stands with Ray, for the life of the process."""

    exiting: bool = False  # the exit flush has taken the runtimes: nothing is started again
    hooked: bool = False  # the exit flush is registered
    unreachable: str = ""  # why Ray could not be reached, said once and then raised again
    local_ray: bool = False  # rlmon started this process's Ray: the exit stops it whole


class RuntimeGone(SinkClosed):
    """Ray was shut down (or the interpreter is exiting): rlmon will not start it again."""


LOCK = threading.RLock()
RUNTIMES: dict[str, Runtime] = {}
PROCESS = uuid.uuid4().hex  # who started a service: the owner shuts it down at exit
STATE = ProcessState()
EXITING = threading.Event()  # set at interpreter exit: a Ray start in progress gives up
FLUSHED = threading.Lock()  # held for good by the first exit flush: it runs once


def runtime_of(namespace: str) -> Runtime | None:
    """The runtime this process holds for ``namespace``, if any."""
    with LOCK:
        return RUNTIMES.get(namespace)


def get_actor(name: str, namespace: str) -> Any:
    """The named actor, or None when none runs."""
    import ray

    try:
        return ray.get_actor(name, namespace=namespace)
    except ValueError:
        return None


def in_ray_worker() -> bool:
    import ray

    return bool(ray.get_runtime_context().worker.mode == ray.WORKER_MODE)
