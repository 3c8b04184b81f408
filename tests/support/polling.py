"""Poll with a deadline instead of sleeping a fixed time (shared by the tests)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

__all__ = ["wait_for"]


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
