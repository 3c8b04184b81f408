"""Stopping the local Ray that rlmon started in this process: whole, and within a deadline.

``ray.shutdown()`` (Ray's own exit hook) only *signals* its processes (SIGTERM, ``wait=False``)
and returns; a ``gcs_server`` shutting down gracefully on a loaded machine, or the dashboard
agent that its ``raylet`` started, outlives the script by seconds. And while ``ray.init`` is
still starting the node on rlmon's keeper thread, it holds Ray's connect lock, so Ray's exit
hook waits for the whole start-up: the exit was held for as long as that took.

So at exit rlmon stops what it started itself: ``ray.shutdown()`` on a thread of its own, waited
for until the deadline; then every process of the session (found by the session name, which
carries this process's pid, and by descent from this process) gets SIGKILL and is waited for,
again until the deadline. Ray's exit hook is unregistered when its work was done here, so that
nothing of Ray's runs after the budget. Linux and macOS (psutil); a process of the session
started after the sweep (a start-up racing the exit) still dies of Ray's parent-death signal.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import threading
import time

import psutil

__all__ = ["session_processes", "stop_local_ray"]

log = logging.getLogger(__name__)

_SWEEP_PERIOD_S = 0.05


def _session_marker(pid: int) -> re.Pattern[str]:
    # ray._private.node names a head's session "session_<date>_<time>_<micros>_<pid of the
    # process that started it>"
    return re.compile(rf"session_\d{{4}}-\d\d-\d\d_\d\d-\d\d-\d\d_\d+_{pid}(?!\d)")


def session_processes(pid: int | None = None) -> list[psutil.Process]:
    """The live processes of the Ray session that process ``pid`` (this one) started: those
    whose command line names the session, and its descendants whose command line is Ray's."""
    me = psutil.Process(pid or os.getpid())
    marker = _session_marker(me.pid)
    born = me.create_time()
    found: dict[int, psutil.Process] = {}
    try:
        for child in me.children(recursive=True):
            try:
                line = " ".join(child.cmdline())
            except psutil.Error:
                continue
            if "ray" in line and ("/ray/" in line or marker.search(line)):
                found[child.pid] = child
    except psutil.Error:
        pass
    for proc in psutil.process_iter(["cmdline", "create_time"]):
        if proc.pid in found or proc.pid == me.pid:
            continue
        line = " ".join(proc.info.get("cmdline") or ())
        started = proc.info.get("create_time") or 0.0
        if started >= born - 1.0 and marker.search(line):
            found[proc.pid] = proc
    return list(found.values())


def _shutdown_ray(deadline: float) -> bool:
    """``ray.shutdown()`` on a daemon thread, waited for until ``deadline``."""
    import ray

    done = threading.Event()

    def stop() -> None:
        try:
            ray.shutdown()
        except Exception as exc:  # never a traceback at exit; the sweep stops what is left
            log.warning("rlmon: ray.shutdown() at exit failed: %s", exc)
        finally:
            done.set()

    threading.Thread(target=stop, name="rlmon-ray-shutdown", daemon=True).start()
    return done.wait(max(0.0, deadline - time.monotonic()))


def stop_local_ray(deadline: float) -> list[str]:
    """Stop the local Ray this process started; by ``deadline`` (monotonic) at the latest.

    Returns what was still alive at the deadline (empty: stopped whole)."""
    import ray

    _shutdown_ray(deadline)
    # Ray's own exit hook would repeat the shutdown, after rlmon's budget: and while ray.init
    # still starts the node on rlmon's keeper thread it holds Ray's connect lock, which that
    # hook waits for (the whole start-up, 10 s and more on a loaded machine). What it would
    # stop is stopped below.
    atexit.unregister(ray.shutdown)
    left: list[psutil.Process] = []
    while True:
        left = []
        for proc in session_processes():
            try:
                proc.kill()
                left.append(proc)
            except psutil.NoSuchProcess:
                continue
            except psutil.Error as exc:
                log.warning("rlmon: could not stop Ray process %d: %s", proc.pid, exc)
        if left:
            _, alive = psutil.wait_procs(left, timeout=max(0.0, deadline - time.monotonic()))
            left = [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        if not left or time.monotonic() >= deadline:
            break
        time.sleep(_SWEEP_PERIOD_S)
    if not left:  # one more look: a start-up racing the exit may have forked since
        time.sleep(min(_SWEEP_PERIOD_S, max(0.0, deadline - time.monotonic())))
        for proc in session_processes():
            try:
                proc.kill()
            except psutil.Error:
                continue
    names = []
    for proc in left:
        try:
            names.append(f"{proc.pid} {proc.name()}")
        except psutil.Error:
            continue
    return names
