"""The exit flush: at interpreter exit (or a driver's SIGTERM), within ``RLMON_EXIT_TIMEOUT``,
Reporters send what they hold, an owned runtime finalizes and delivers, and a local Ray that
rlmon started is stopped whole."""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections.abc import Callable

from rlmon.actors.reporter import outcome
from rlmon.actors.reporter.sink import close_open_senders
from rlmon.actors.runtime.held import EXITING, FLUSHED, LOCK, RUNTIMES, STATE
from rlmon.actors.runtime.shutdown import shutdown_runtime

__all__ = ["before_exit_flush", "hook_exit"]

log = logging.getLogger(__name__)

_STOP_RESERVE_S = 1.0  # of the exit budget, kept for stopping a local Ray rlmon started
_STOP_MIN_S = 0.2  # ... and at least this, even when the budget is spent: SIGKILL and a reap


def hook_exit() -> None:
    """Flush at interpreter exit while Ray is still up: Reporters send what they hold (waiting
    for Ray's start-up if the script was shorter), an owned runtime finalizes its open steps and
    delivers its alerts. ``threading._register_atexit`` hooks run when the main thread ends,
    before every ``atexit`` hook, Ray's ``shutdown`` among them (concurrent.futures uses it the
    same way); ``atexit`` is the fallback."""
    with LOCK:
        if STATE.hooked:
            return
        STATE.hooked = True
    # Once the interpreter's shutdown has begun, threading refuses new _register_atexit hooks,
    # and importing concurrent.futures.thread registers one: a script that exits straight after
    # its last end_step has Ray imported by this exit flush, and `import ray` (through urllib3)
    # failed there with "can't register atexit after shutdown", losing every step. Imported
    # now, while the Reporter starts (a few milliseconds, stdlib only), it is already loaded.
    import concurrent.futures.thread  # noqa: F401
    register = getattr(threading, "_register_atexit", None)
    outcome.exit_flush(_at_exit)  # what a SIGTERM runs before the process dies of it
    try:
        if register is None:
            raise RuntimeError("no threading._register_atexit")
        register(_at_exit)
    except RuntimeError:
        atexit.register(_at_exit)


_BEFORE_EXIT_FLUSH: list[Callable[[], None]] = []


def before_exit_flush(callback: Callable[[], None]) -> None:
    """Run ``callback`` at interpreter exit before Reporters flush (an integration's last window,
    such as vLLM's open step, must reach its Reporter first). A failure is logged, not raised."""
    hook_exit()
    with LOCK:
        if callback not in _BEFORE_EXIT_FLUSH:
            _BEFORE_EXIT_FLUSH.append(callback)


def _at_exit() -> None:
    """The exit flush, within ``RLMON_EXIT_TIMEOUT`` whatever Ray does (starting, shut down by
    the user, unreachable): Reporters send what they hold (waiting for Ray's start-up if the
    script was shorter), an owned runtime finalizes its open steps and delivers its alerts, and
    a local Ray that rlmon started is stopped whole (rlmon.actors.runtime.local_ray). Every wait
    is bounded by one deadline; a part the budget did not reach is said, never waited for."""
    if not FLUSHED.acquire(blocking=False):
        return
    deadline = time.monotonic() + outcome.exit_budget()

    def left() -> float:
        return max(0.0, deadline - time.monotonic())

    for callback in list(_BEFORE_EXIT_FLUSH):
        try:
            callback()
        except Exception as exc:  # never turn a clean exit into a traceback, but say it
            log.warning("rlmon: exit callback %s failed: %s", callback, exc)
    local = STATE.local_ray
    # Stopping a local Ray takes a moment (killing and reaping its processes): kept from the
    # Reporters' share of the budget, so that the stop is inside it too
    senders_until = deadline - (min(_STOP_RESERVE_S, outcome.exit_budget() / 4) if local else 0.0)
    # a script shorter than Ray's start-up still gets every step through: wait for it, within
    # the budget; at the budget's end (not after each sender's join) a sender still waiting for
    # Ray's start-up gives up, and so does the start itself (releasing LOCK)
    out_of_budget = threading.Timer(max(0.0, senders_until - time.monotonic()), EXITING.set)
    out_of_budget.daemon = True
    out_of_budget.start()
    close_open_senders(timeout=max(0.0, senders_until - time.monotonic()))
    out_of_budget.cancel()
    EXITING.set()
    owned: list[str] = []
    if LOCK.acquire(timeout=left()):
        try:
            STATE.exiting = True
            owned = [rt.namespace for rt in RUNTIMES.values() if rt.owned and not rt.detached]
        finally:
            LOCK.release()
    else:
        log.warning("rlmon: the runtime is still busy at exit; not waiting for it")
    for namespace in owned:
        try:
            shutdown_runtime(namespace, timeout=min(10.0, left()), deadline=deadline)
        except Exception as exc:  # never let rlmon turn a clean exit into a traceback
            log.warning("rlmon: shutting down namespace %r at exit failed: %s", namespace, exc)
    if local:
        from rlmon.actors.runtime.local_ray import stop_local_ray

        try:
            alive = stop_local_ray(max(deadline, time.monotonic() + _STOP_MIN_S))
        except Exception as exc:
            log.warning("rlmon: stopping the local Ray at exit failed: %s", exc)
        else:
            if alive:
                log.warning("rlmon: the local Ray's processes %s were still stopping when the "
                            "exit budget (RLMON_EXIT_TIMEOUT) ran out", ", ".join(alive))
