"""When no progress is too long: the stall, stuck-stage, slow and dead thresholds of a run.

A stall is judged against the run's own step period: ``max(k x typical period, floor)``, where
the typical period is the median of the recent intervals between finalized steps, raised to a
margin over the longest recent interval so a run whose every tenth step evaluates (and takes
three times longer) does not page for it. With the defaults (k = 4, floor = 90 s) a run of
2-second steps pages about 90 s after its last step and a run of 10-minute steps 40 minutes
after it (its occasional 20-minute step never pages). Until a run has finalized two steps there
is no period; its first step may take ``first_step_seconds``. A stage is stuck when one rank has
been in it for ``max(stuck_factor x its usual duration, stuck_floor)``, the usual duration being
the longest recent span of that name in the run's step timelines (or the step period when the
timelines never named it). See docs/liveness.md for the figures behind the defaults.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from statistics import median

__all__ = ["LivenessParams", "StepPeriods"]


@dataclass(frozen=True, slots=True)
class LivenessParams:
    heartbeat_seconds: float = 5.0  # how often a Reporter's sender thread heartbeats
    stall_factor: float = 4.0  # k: stalled after k typical step periods without a step
    stall_floor_seconds: float = 90.0  # ... and never before this
    max_interval_margin: float = 1.25  # ... nor before this x the longest recent interval
    first_step_seconds: float = 3600.0  # a run's first two steps may take this long
    dead_after_seconds: float = 30.0  # every rank silent (no heartbeat, no step) this long
    slow_factor: float = 3.0  # slow: recent step intervals this far above the baseline
    slow_steps: int = 3  # ... for this many intervals in a row
    stuck_factor: float = 3.0  # a rank this many usual durations into one stage ...
    stuck_floor_seconds: float = 60.0  # ... and at least this long, while others are elsewhere
    window: int = 16  # recent intervals kept for the typical period
    baseline_window: int = 64  # intervals the slow baseline holds (frozen while slow)
    evaluate_seconds: float = 1.0  # the timer: how often states are re-evaluated
    gpus_per_rank: float = 1.0  # for the stall's cost, unless the Reporter says otherwise

    def __post_init__(self) -> None:
        for name in ("heartbeat_seconds", "stall_factor", "stall_floor_seconds",
                     "first_step_seconds", "dead_after_seconds", "slow_factor", "stuck_factor",
                     "stuck_floor_seconds", "evaluate_seconds"):
            if not getattr(self, name) > 0:
                raise ValueError(f"liveness.{name} must be > 0, got {getattr(self, name)!r}")
        if self.window < 3 or self.baseline_window < 8 or self.slow_steps < 1:
            raise ValueError("liveness: window >= 3, baseline_window >= 8, slow_steps >= 1")


@dataclass(slots=True)
class StepPeriods:
    """The intervals between a stream's finalized steps: the typical period, the slow check."""

    recent: deque[float] = field(default_factory=deque)
    baseline: deque[float] = field(default_factory=deque)
    slow_run: int = 0  # consecutive intervals above slow_factor x baseline

    def add(self, interval: float, params: LivenessParams, slow: bool) -> None:
        """One more interval; the baseline stays as it was while the stream is slow, so a
        lasting slowdown does not become the new normal."""
        if interval <= 0:
            return
        self.recent.append(interval)
        while len(self.recent) > params.window:
            self.recent.popleft()
        reference = self.reference()
        if reference is not None and interval > params.slow_factor * reference:
            self.slow_run += 1
        else:
            self.slow_run = 0
        if not slow and self.slow_run == 0:
            self.baseline.append(interval)
            while len(self.baseline) > params.baseline_window:
                self.baseline.popleft()

    def reference(self) -> float | None:
        """The baseline step period (None before 8 intervals)."""
        return median(self.baseline) if len(self.baseline) >= 8 else None

    def typical(self) -> float | None:
        return median(self.recent) if self.recent else None

    def stall_threshold(self, params: LivenessParams, steps: int) -> float:
        """Seconds without a finalized step before the stream is stalled."""
        if steps < 2 or not self.recent:
            return max(params.first_step_seconds, params.stall_floor_seconds)
        # the last three intervals too: once a slowdown is three steps old, the stall threshold
        # follows the new pace at once instead of paging every slow step until the median does
        typical = max(median(self.recent), median(list(self.recent)[-3:]))
        return max(params.stall_factor * typical, params.stall_floor_seconds,
                   params.max_interval_margin * max(self.recent))

    def is_slow(self, params: LivenessParams) -> bool:
        return self.slow_run >= params.slow_steps

    def recovered(self, params: LivenessParams) -> bool:
        """Back to normal: the last interval within the slow factor of the baseline."""
        return self.slow_run == 0

    def to_json(self) -> dict[str, list[float]]:
        return {"recent": list(self.recent), "baseline": list(self.baseline),
                "slow_run": [float(self.slow_run)]}

    @classmethod
    def from_json(cls, obj: dict[str, list[float]]) -> StepPeriods:
        return cls(deque(float(v) for v in obj.get("recent", ())),
                   deque(float(v) for v in obj.get("baseline", ())),
                   int(obj.get("slow_run", [0.0])[0]))
