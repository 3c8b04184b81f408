"""Poll with a deadline instead of sleeping a fixed time (shared by the tests)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

__all__ = ["CHILD_RUN_S", "PATIENCE_S", "wait_for", "with_patience"]

# Seconds a test waits for what the system does within seconds (a flush, an alert, a step
# stored, a port to answer, an actor to start): CI's 2-core machine under load can be minutes
# late, and a wait returns as soon as its condition holds.
PATIENCE_S = 180.0
# Seconds a child process that starts Ray (or the demo) gets to run to its end: Ray's start
# alone can take a minute there. Under pytest-timeout's 300 s per test (pyproject), so a hung
# child is killed and reported by its own timeout, not left running when the test is.
CHILD_RUN_S = 240.0


def wait_for(predicate: Callable[[], Any], timeout: float, what: str = "condition",
             every: float = 0.02) -> Any:
    """Poll ``predicate`` until truthy and return its value; fail with ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(every)


def with_patience(script: str) -> str:
    """A child script's text with ``PATIENCE_S`` defined first, for its own flushes."""
    return f"PATIENCE_S = {PATIENCE_S!r}\n{script}"
