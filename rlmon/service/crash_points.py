"""Named commit points where a test may kill the service, to prove each one is safe to die at.

``RLMON_CRASH_AT=NAME`` makes the process SIGKILL itself the first time it passes the point
``NAME``; ``NAME:N`` the N-th time. Unset (always, outside tests) a point costs one environment
lookup. SIGKILL, not an exception: nothing (``finally``, ``atexit``, a SQLite rollback) gets to
tidy up, exactly as when the kernel or Kubernetes kills the pod.

The points, in the order a step passes them:

- ``publish.before_history``: the step was evaluated, nothing is stored yet;
- ``publish.after_history``: the step, its alert transitions and their pending notifications are
  committed to the history store, the outbox has none of them;
- ``publish.after_outbox``: the outbox holds the notifications, no delivery has started;
- ``deliver.sending``: a delivery thread claimed an outbox row and is about to send it;
- ``drain.sending``: the graceful drain (shutdown) claimed a row and is about to send it.
"""

from __future__ import annotations

import os
import signal
import threading

__all__ = ["CRASH_AT", "POINTS", "crash_point"]

CRASH_AT = "RLMON_CRASH_AT"
POINTS = ("publish.before_history", "publish.after_history", "publish.after_outbox",
          "deliver.sending", "drain.sending")

_passed: dict[str, int] = {}
_lock = threading.Lock()


def crash_point(name: str) -> None:
    """Kill this process here if ``RLMON_CRASH_AT`` names this point (and this pass)."""
    wanted = os.environ.get(CRASH_AT)
    if not wanted:
        return
    point, _, nth = wanted.partition(":")
    if point != name:
        return
    with _lock:
        _passed[name] = _passed.get(name, 0) + 1
        if _passed[name] >= int(nth or 1):
            os.kill(os.getpid(), signal.SIGKILL)
