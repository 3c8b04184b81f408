"""A Reporter inside a Ray actor: how the actor's end reaches rlmon (docs/liveness.md).

Ray ends an actor without running its ``atexit`` hooks, so a Reporter there never gets to say
"clean" or "failed" by itself. Two things help it:

* :func:`register_shutdown`: Ray calls an actor's ``__ray_shutdown__`` on a graceful termination
  (its last handle released, ``__ray_terminate__``); the Reporter puts one on its actor that
  closes it (chained to the actor's own, which runs first). Ray does not call it on ``ray.kill``
  nor when the driver exits: those ends are read from Ray's death cause by the service.
* :func:`watch_methods`: a class decorator (applied under ``@ray.remote``) whose wrapper notes an
  exception leaving any public method on every open Reporter of the process and sends a
  heartbeat at once, before Ray hands the exception to the driver. The driver then usually exits
  and Ray tears the actor down; the service names the rank, the exception and the stage from that
  heartbeat. Ray's own failed-task events say the same where the wrapper is not installed.
"""

from __future__ import annotations

import functools
import inspect
import logging
import sys
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["actor_instance", "register_shutdown", "watch_methods"]

log = logging.getLogger(__name__)

# the most a raising method waits for its heartbeat to reach the aggregator: the exception then
# usually ends the run and Ray tears the actor down. The round trip is milliseconds, but over a
# second on a loaded machine, where a 1 s wait let the note arrive after Ray's account of the
# dead actor and the page named no stage (make test-load)
_NOTE_WAIT_S = 5.0
_SHUTDOWN_ATTR = "__ray_shutdown__"
_CLOSERS = "_rlmon_closers"

C = TypeVar("C", bound=type)


def actor_instance() -> Any | None:
    """The Ray actor this code runs in (its instance), or None outside an actor."""
    ray = sys.modules.get("ray")
    if ray is None:
        return None
    try:
        if not ray.is_initialized():
            return None
        actor_id = ray.get_runtime_context().get_actor_id()
        if not actor_id:
            return None
        actors = getattr(ray._private.worker.global_worker, "actors", {})
        return actors.get(ray.ActorID.from_hex(actor_id))
    except Exception:  # a Ray without these internals: the death cause still tells
        return None


def register_shutdown(close: Callable[[], None]) -> bool:
    """Have the actor this runs in call ``close`` when Ray ends it gracefully; False outside an
    actor (or before its instance exists). The actor's own ``__ray_shutdown__`` runs first."""
    instance = actor_instance()
    if instance is None:
        return False
    closers: list[Callable[[], None]] | None = instance.__dict__.get(_CLOSERS)
    if closers is None:
        closers = []
        own = getattr(instance, _SHUTDOWN_ATTR, None)

        def shutdown() -> None:
            try:
                if callable(own):
                    own()
            finally:
                for closer in list(closers or ()):
                    try:
                        closer()
                    except Exception as exc:  # one Reporter's failure must not skip the next
                        log.warning("rlmon: closing a Reporter at the actor's shutdown: %s", exc)

        try:
            instance.__dict__[_CLOSERS] = closers
            instance.__dict__[_SHUTDOWN_ATTR] = shutdown
        except (AttributeError, TypeError):  # __slots__ without a __dict__
            return False
    closers.append(close)
    return True


def _note(exc: BaseException) -> None:
    from rlmon.actors.reporter.sink import open_senders

    for sender in open_senders():
        note = getattr(sender, "note_raised", None)
        if callable(note):
            note(exc, wait=_NOTE_WAIT_S)


def _wrap(method: Callable[..., Any]) -> Callable[..., Any]:
    if inspect.iscoroutinefunction(method):
        @functools.wraps(method)
        async def async_watched(*args: Any, **kwargs: Any) -> Any:
            try:
                return await method(*args, **kwargs)
            except Exception as exc:
                _note(exc)
                raise

        return async_watched

    @functools.wraps(method)
    def watched(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except Exception as exc:
            _note(exc)
            raise

    return watched


def watch_methods(cls: C) -> C:
    """Wrap each public method of ``cls`` so that an exception leaving it is noted on the
    process's open Reporters (said in a heartbeat at once), then raised as before. Use it under
    ``@ray.remote`` (Ray reads an actor's methods from its class when it creates the actor)::

        @ray.remote
        @watch_methods
        class PolicyRank: ...
    """
    for name, member in list(vars(cls).items()):
        if name.startswith("_") or not inspect.isfunction(member):
            continue
        setattr(cls, name, _wrap(member))
    return cls
