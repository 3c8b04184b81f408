"""The one clock type: a function returning seconds, injected wherever time is read so tests and
soak runs can drive simulated time."""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["Clock"]

Clock = Callable[[], float]
