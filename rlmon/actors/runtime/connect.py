"""Connecting this process to Ray: the cluster named by the caller or ``RAY_ADDRESS``, else a
local Ray of rlmon's own, started on a thread that lives as long as the process and waited for
within a bound."""

from __future__ import annotations

import os
import threading
import time

from rlmon.actors.reporter import outcome
from rlmon.actors.runtime.held import EXITING, RUNTIMES, STATE, RuntimeGone

__all__ = ["connect_ray", "gcs_address", "not_connected", "ray_address"]


def ray_address(explicit: str | None = None) -> tuple[str, str]:
    """(address for ``ray.init``, where it came from). Without ``RAY_ADDRESS`` or an explicit
    address, rlmon starts a Ray of its own ("local"): Ray's default would join whatever cluster
    its current-cluster file names, a ``ray start`` the user never asked rlmon to join, and a
    dead one left that file behind."""
    if explicit:
        return explicit, "the address given to rlmon"
    env = os.environ.get("RAY_ADDRESS")
    if env:
        return env, "RAY_ADDRESS"
    return "local", "a local Ray of rlmon's own"


def _connect_timeout() -> float:
    return float(os.environ.get("RLMON_RAY_CONNECT_TIMEOUT", "120"))


def connect_ray(namespace: str, address: str | None = None) -> None:
    """Start a local Ray when none is connected, unless this process already had one: a second
    local Ray started after the user's (or Ray's exit hook's) ``ray.shutdown()`` would outlive
    the script and, at interpreter exit, crash beside libraries such as vLLM.

    From any thread (a Reporter's sender, or ``ensure_runtime`` called by the script), the wait
    is bounded by ``RLMON_RAY_CONNECT_TIMEOUT`` (120 s) and by the interpreter's exit: a Ray that
    cannot be reached is said once, in rlmon's words, and never holds the process."""
    import ray

    if STATE.exiting:
        raise RuntimeGone("the interpreter is exiting")
    if ray.is_initialized():
        return
    if RUNTIMES:
        raise RuntimeGone("Ray was shut down in this process; rlmon does not restart it")
    if STATE.unreachable:
        raise RuntimeGone(STATE.unreachable)
    os.environ.setdefault("RAY_DISABLE_USAGE_STATS", "1")
    target, source = ray_address(address)
    # A driver's SIGTERM runs the exit flush before the process dies of it (what ray.init's own
    # handler would do on the main thread; the keeper thread below cannot install one). Chained,
    # never over a handler of the user's: rlmon.actors.reporter.outcome
    outcome.install()
    if target == "local":
        STATE.local_ray = True  # rlmon starts this Ray: the exit stops it whole
    # Ray's local processes get SIGKILL when the *thread* that started them ends
    # (PR_SET_PDEATHSIG), and a Reporter's sender thread ends when the Reporter closes: start
    # Ray on a daemon thread that lives as long as the process. Waiting for it there bounds the
    # wait on every thread: ray.init itself retries an unreachable address for minutes.
    started = threading.Event()
    failure: list[BaseException] = []

    def keep() -> None:
        try:
            ray.init(address=target, namespace=namespace, include_dashboard=False,
                     log_to_driver=True)
        except BaseException as exc:
            failure.append(exc)
            return
        finally:
            started.set()
        threading.Event().wait()

    threading.Thread(target=keep, name="rlmon-ray", daemon=True).start()
    deadline = time.monotonic() + _connect_timeout()
    while not started.wait(0.1):
        if EXITING.is_set() or time.monotonic() > deadline:
            break
    if started.is_set() and not failure:
        return
    # said once, by the Reporter that asked (it names its run and what it could not send)
    text = not_connected(target, source, failure[0] if failure else None, EXITING.is_set())
    STATE.unreachable = text
    raise RuntimeGone(text)


def not_connected(target: str, source: str, failure: BaseException | None,
                  at_exit: bool) -> str:
    """Why this process's metrics are not delivered, and what to do, in rlmon's words."""
    where = (f"could not start {source}" if target == "local"
             else f"could not reach the Ray cluster at {target} (from {source})")
    why = (f"{type(failure).__name__}: {failure}" if failure is not None else
           "no answer within " + ("the exit budget (RLMON_EXIT_TIMEOUT)" if at_exit
                                  else f"{_connect_timeout():g}s (RLMON_RAY_CONNECT_TIMEOUT)"))
    advice = ("Raise RLMON_EXIT_TIMEOUT, or call flush() before the script ends"
              if target == "local" and at_exit and failure is None else
              "Ray's logs in its session directory (under RAY_TMPDIR, /tmp/ray by default) say why"
              if target == "local" else
              "Unset RAY_ADDRESS to let rlmon start its own Ray, or start the cluster it names")
    return f"{where}: {why}; this process's metrics are not delivered. {advice}"


def gcs_address() -> str:
    """The address of the Ray this process is connected to, for the words rlmon prints."""
    import ray

    try:
        return str(ray.get_runtime_context().gcs_address)
    except Exception:  # an older Ray, or a client connection: say what is known
        return os.environ.get("RAY_ADDRESS") or "unknown"
