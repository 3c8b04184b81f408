"""The one fake clock of the tests: code under test reads time through an injected
:data:`rlmon.service.clock.Clock` (a function returning seconds), and the test moves it."""

from __future__ import annotations

__all__ = ["FakeClock"]


class FakeClock:
    """A clock that stands still until the test moves it (:meth:`advance`, or ``now`` set).

    Calling it reads ``now``. :meth:`wall` reads the same clock as unix seconds,
    ``wall_offset`` ahead, for code given both a monotonic clock and a wall clock
    (``AggregatorCore(clock=c, wall_clock=c.wall)``).
    """

    def __init__(self, now: float = 1_000.0, *, wall_offset: float = 0.0) -> None:
        self.now = now
        self.wall_offset = wall_offset

    def __call__(self) -> float:
        return self.now

    def wall(self) -> float:
        return self.now + self.wall_offset

    @property
    def wall_now(self) -> float:
        return self.wall()

    @wall_now.setter
    def wall_now(self, value: float) -> None:
        self.now = value - self.wall_offset

    def advance(self, seconds: float) -> float:
        """Move the clock ``seconds`` on; returns the new reading."""
        self.now += seconds
        return self.now
