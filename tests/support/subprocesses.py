"""Running a script as a user would, in a process group of its own (shared by the tests)."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Sequence
from typing import Any

__all__ = ["run_in_own_session"]


def run_in_own_session(cmd: Sequence[str], timeout: float,
                       **popen: Any) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` to completion with stdout and stderr captured as text. It gets a session of
    its own, so a timeout kills everything it started (Ray's processes, torchrun's workers)
    before the TimeoutExpired propagates."""
    proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, **popen)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
