"""The unit layer's rules, checked around every test of tests/unit (tests/unit/conftest.py):
no subprocess, no socket and no thread left alive (docs/development.md, "The suite in layers").

A test that needs one of them is a service-layer test (tests/service) or belongs further out;
the check says so instead of letting the unit layer slowly become a concurrent suite.
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Collection
from typing import Any

import pytest

__all__ = ["LayerViolation", "refuse_processes_and_sockets", "threads_left"]

_MOVE = "move the test to tests/service (or further out: docs/development.md)"


class LayerViolation(RuntimeError):
    """A unit test reached for what the unit layer does not have."""


def _refusing(what: str) -> Callable[..., Any]:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise LayerViolation(f"a unit test {what}: {_MOVE}")

    return refuse


def refuse_processes_and_sockets(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make starting a process, forking, and binding or connecting a socket raise
    :class:`LayerViolation` until ``monkeypatch`` undoes it (Ray, an HTTP server and a
    ``python -m rlmon`` child all need one of them)."""
    monkeypatch.setattr(subprocess.Popen, "__init__", _refusing("starts a subprocess"))
    monkeypatch.setattr(os, "fork", _refusing("forks"))
    for name in ("bind", "connect", "connect_ex"):
        monkeypatch.setattr(socket.socket, name, _refusing(f"calls socket.{name}"))


def threads_left(before: Collection[threading.Thread], grace: float = 2.0) -> list[str]:
    """The threads started since ``before`` that are still alive after ``grace`` seconds of
    joining them (a thread being stopped as the test ends gets that long to finish)."""
    deadline = time.monotonic() + grace
    left = [t for t in threading.enumerate() if t not in before and t.is_alive()]
    for thread in left:
        thread.join(max(0.0, deadline - time.monotonic()))
    return [f"{t.name} ({'daemon' if t.daemon else 'non-daemon'})" for t in left if t.is_alive()]
