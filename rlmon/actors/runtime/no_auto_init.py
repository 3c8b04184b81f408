"""rlmon's own calls into Ray never start or join a Ray by Ray's auto-init.

Ray wraps its calls (``ray.get``, ``ray.get_actor``, an actor method's ``.remote()``) so that a
call made while Ray is not initialized first runs a bare ``ray.init()``, which joins whatever
cluster Ray's current-cluster file names (often the one just shut down) and retries it for
minutes. rlmon checks that Ray is up before it calls, but its sender, heartbeat and console
threads run beside the script: a ``ray.shutdown()`` (the user's, or Ray's exit hook's) can land
between the check and the call. Inside :func:`no_auto_init` such a call raises instead, as any
call after the shutdown would.

The switch is Ray's own (``RAY_ENABLE_AUTO_CONNECT=0`` sets it at import), turned off only while
one of rlmon's calls is in flight, so a script's own calls keep Ray's default; a Ray without it
is left as it is.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["no_auto_init"]

_LOCK = threading.Lock()
_inside = 0  # rlmon calls in flight, over all threads
_before = True  # Ray's setting before the first of them


def _hook() -> Any:  # Ray's module, typed loosely: the switch is not in its stubs
    try:
        from ray._private import auto_init_hook
    except ImportError:  # an older or newer Ray without it: nothing to turn off
        return None
    return auto_init_hook if hasattr(auto_init_hook, "enable_auto_connect") else None


@contextlib.contextmanager
def no_auto_init() -> Iterator[None]:
    """Ray's auto-init off for the calls made inside (from any thread, nested or not)."""
    global _inside, _before
    hook = _hook()
    if hook is None:
        yield
        return
    with _LOCK:
        if _inside == 0:
            _before = hook.enable_auto_connect
            hook.enable_auto_connect = False
        _inside += 1
    try:
        yield
    finally:
        with _LOCK:
            _inside -= 1
            if _inside == 0:
                hook.enable_auto_connect = _before
