"""How long an open step may wait for its missing ranks before it finalizes without them.

A fixed deadline is simplest to reason about; by default the deadline follows the run instead:
a multiple of the observed step period (the time between the first reports of consecutive
steps of the same run and role), and at least a margin over the lag the ranks themselves show
(how long after a step's first report each rank's report came, the slowest recently seen),
clamped to [floor, ceiling]. Until two steps were seen, the initial deadline applies.

Past its deadline a step still waits for a missing rank that is *alive but behind*: one heard
from (for any earlier step of the run and role) within the last deadline. Such a rank is sending,
so it will report; a dead rank falls silent and is reported missing one deadline after its last
word. Until every rank of the world was heard once, steps wait the initial deadline (ranks start
at their own pace). No step waits longer than ``ceiling`` from its first report.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from rlmon.service.metrics.rank import Rank

__all__ = ["DeadlinePolicy"]

Stream = tuple[str, str]


@dataclass(slots=True)
class DeadlinePolicy:
    fixed: float | None = None
    factor: float = 3.0
    floor: float = 2.0
    ceiling: float = 600.0
    initial: float = 60.0
    smoothing: float = 0.3
    lag_margin: float = 1.5  # the deadline covers the slowest recent rank's lag with this margin
    lag_decay: float = 0.98  # per report: an old worst lag fades over a few hundred reports
    _period: dict[Stream, float] = field(default_factory=dict)
    _last: dict[Stream, tuple[int, float]] = field(default_factory=dict)
    _lag: dict[Stream, float] = field(default_factory=dict)
    _heard: dict[Stream, dict[Rank, tuple[float, int]]] = field(default_factory=dict)

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

    def heard(self, run: str, role: str, ranks: Collection[Rank], step: int, now: float,
              step_first_seen: float) -> None:
        """``ranks`` reported ``step`` (first seen at ``step_first_seen``) at ``now``."""
        key = (run, role)
        heard = self._heard.setdefault(key, {})
        for rank in ranks:
            last = heard.get(rank)
            heard[rank] = (now, step if last is None else max(step, last[1]))
        lag = now - step_first_seen
        self._lag[key] = max(lag, self._lag.get(key, 0.0) * self.lag_decay)

    def period(self, run: str, role: str) -> float | None:
        return self._period.get((run, role))

    def __call__(self, run: str, role: str) -> float:
        if self.fixed is not None:
            return self.fixed
        period = self._period.get((run, role))
        if period is None:
            return self.initial
        wait = max(self.factor * period, self.lag_margin * self._lag.get((run, role), 0.0))
        return min(max(wait, self.floor), self.ceiling)

    def waits_for_alive(self, run: str, role: str, step: int, reported: Collection[Rank],
                        world_size: int, now: float, first_seen: float) -> bool:
        """Whether a step past its deadline should still wait: some rank that has not reported
        it is behind (its latest report is of an earlier step: a rank that reported a later one
        skipped this one) and was heard from within the last deadline; never past the ceiling.

        Until every rank of the world was heard once (start-up: ranks come up at their own
        pace), a step waits the initial deadline from its first report."""
        if now - first_seen >= self.ceiling:
            return False
        heard = self._heard.get((run, role), {})
        if len(heard) < world_size and now - first_seen < self.initial:
            return True
        window = self(run, role)
        return any(now - at < window and last < step and rank not in reported
                   for rank, (at, last) in heard.items())

    def dump(self, run: str, role: str, *, now: float, wall: float) -> dict[str, Any]:
        """What is known of a stream, its times as unix seconds (``now`` is this policy's clock
        at ``wall``), for a restarted aggregator to continue from (:meth:`load`)."""
        key = (run, role)
        last = self._last.get(key)
        return {
            "period": self._period.get(key), "lag": self._lag.get(key),
            "last": [last[0], wall - (now - last[1])] if last is not None else None,
            "heard": [[list(rank), wall - (now - at), step]
                      for rank, (at, step) in self._heard.get(key, {}).items()],
        }

    def load(self, run: str, role: str, data: dict[str, Any], *, now: float,
             wall: float) -> None:
        """Continue from :meth:`dump`: the period and each rank's last word survive a restart,
        so a step does not wait the start-up deadline for a rank that died before it."""
        key = (run, role)
        try:
            if data.get("period") is not None:
                self._period[key] = float(data["period"])
            if data.get("lag") is not None:
                self._lag[key] = float(data["lag"])
            last = data.get("last")
            if last is not None:
                self._last[key] = (int(last[0]), now - (wall - float(last[1])))
            heard = {Rank(*map(int, rank)): (now - (wall - float(at)), int(step))
                     for rank, at, step in data.get("heard", ())}
        except (TypeError, ValueError, KeyError):
            return  # unreadable: relearned from the next reports
        if heard:
            self._heard[key] = heard

    def forget(self, run: str, role: str) -> None:
        """Drop what is known of a stream (it went quiet, or began a new attempt)."""
        key = (run, role)
        for table in (self._period, self._last, self._lag, self._heard):
            table.pop(key, None)

    def streams(self) -> set[Stream]:
        return set(self._last) | set(self._heard)
