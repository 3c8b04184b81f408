"""How long an open step may wait for its missing ranks before it finalizes without them.

A fixed deadline is simplest to reason about; by default the deadline follows the run instead:
a multiple of the observed step period (the time between the first reports of consecutive
steps of the same run and role), clamped to [floor, ceiling]. Until two steps were seen, the
initial deadline applies.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["DeadlinePolicy"]


@dataclass(slots=True)
class DeadlinePolicy:
    fixed: float | None = None
    factor: float = 3.0
    floor: float = 2.0
    ceiling: float = 600.0
    initial: float = 60.0
    smoothing: float = 0.3
    _period: dict[tuple[str, str], float] = field(default_factory=dict)
    _last: dict[tuple[str, str], tuple[int, float]] = field(default_factory=dict)

    def observe(self, run: str, role: str, step: int, first_seen: float) -> None:
        """Note when a step was first seen; consecutive steps give the period."""
        key = (run, role)
        last = self._last.get(key)
        if last is not None and step > last[0]:
            period = (first_seen - last[1]) / (step - last[0])
            if period > 0:
                old = self._period.get(key)
                self._period[key] = period if old is None else (
                    old + self.smoothing * (period - old))
        if last is None or step > last[0]:
            self._last[key] = (step, first_seen)

    def period(self, run: str, role: str) -> float | None:
        return self._period.get((run, role))

    def __call__(self, run: str, role: str) -> float:
        if self.fixed is not None:
            return self.fixed
        period = self._period.get((run, role))
        if period is None:
            return self.initial
        return min(max(self.factor * period, self.floor), self.ceiling)
