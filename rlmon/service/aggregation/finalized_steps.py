"""Which steps of one (run, role) are finalized: a bounded interval set.

The step assembler asks it whether a record is late; the watermark store persists it on its own,
so that a restarted aggregator finalizes no step twice.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

__all__ = ["FinalizedSteps"]


class FinalizedSteps:
    """Which steps of one (run, role) are finalized, in bounded memory.

    Everything below ``floor`` is finalized; above it, disjoint ``[start, end)`` intervals, so a
    run of consecutive steps costs one interval however long it is. A step that never arrived is
    never taken for finalized. Memory is bounded by ``limit`` intervals: when more separate
    intervals pile up (a run with thousands of gaps), the oldest is *forgotten*: the span from
    it up to the next interval joins the forgotten span ``[forgotten_from, forgotten_to)``, where
    it is no longer known which steps were finalized. A record for a step there is neither late
    nor a new step: the assembler rejects it (:meth:`forgot`), so no step that was never finalized
    is counted late, and none is finalized twice.
    """

    __slots__ = ("_ends", "_starts", "floor", "forgotten_from", "forgotten_to", "limit")

    def __init__(self, floor: int = 0, limit: int = 4096) -> None:
        self.floor = floor
        self.limit = limit
        self.forgotten_from = self.forgotten_to = floor  # empty
        self._starts: list[int] = []
        self._ends: list[int] = []

    def __contains__(self, step: int) -> bool:
        if step < self.floor:
            return True
        if self.forgotten_from <= step < self.forgotten_to:
            return False
        i = bisect.bisect_right(self._starts, step) - 1
        return i >= 0 and step < self._ends[i]

    def forgot(self, step: int) -> bool:
        """Whether ``step`` lies in the forgotten span (finalized or not, no longer known)."""
        return self.forgotten_from <= step < self.forgotten_to

    def add(self, step: int) -> None:
        if step in self or self.forgot(step):
            return
        starts, ends = self._starts, self._ends
        i = bisect.bisect_right(starts, step)
        joins_left = i > 0 and ends[i - 1] == step
        joins_right = i < len(starts) and starts[i] == step + 1
        if joins_left and joins_right:
            ends[i - 1] = ends[i]
            del starts[i], ends[i]
        elif joins_left:
            ends[i - 1] = step + 1
        elif joins_right:
            starts[i] = step
        else:
            starts.insert(i, step)
            ends.insert(i, step + 1)
        while len(starts) > 1 and len(starts) + (
                self.forgotten_to > self.forgotten_from) > self.limit:
            # Forget the oldest interval: the span from it to the next one joins the forgotten
            # span (one span: intervals are never inside it, so any below it go with it).
            empty = self.forgotten_to <= self.forgotten_from
            self.forgotten_from = starts[0] if empty else min(self.forgotten_from, starts[0])
            self.forgotten_to = max(self.forgotten_to, starts[1])
            k = bisect.bisect_left(starts, self.forgotten_to)
            del starts[:k], ends[:k]
        if starts and starts[0] <= self.floor:
            self.floor = max(self.floor, ends[0])
            del starts[0], ends[0]

    @property
    def high(self) -> int:
        """One past the highest finalized step (``floor`` when nothing lies above it)."""
        if self._ends:
            return self._ends[-1]
        return max(self.floor, self.forgotten_to)

    def intervals(self) -> list[tuple[int, ...]]:
        """The finalized ``[start, end)`` intervals above ``floor``, in order; a forgotten span
        comes first as ``(start, end, 0)`` (what :meth:`restore` reads back)."""
        spans: list[tuple[int, ...]] = []
        if self.forgotten_to > self.forgotten_from:
            spans.append((self.forgotten_from, self.forgotten_to, 0))
        spans.extend(zip(self._starts, self._ends, strict=True))
        return spans

    @classmethod
    def restore(cls, floor: int, intervals: Iterable[Iterable[int] | int]) -> FinalizedSteps:
        """Rebuild from :meth:`intervals` (single steps, as older watermarks stored, also work)."""
        done = cls(floor)
        items: list[tuple[int, ...]] = []
        for item in intervals:
            span = (item, item + 1) if isinstance(item, int) else tuple(item)
            if len(span) == 3:
                done.forgotten_from, done.forgotten_to = span[0], span[1]
            else:
                items.append(span)
        for start, end in sorted(items):
            if end <= done.high or start < done.forgotten_to:
                for step in range(start, end):  # covered, or out of order: step by step
                    done.add(step)
            elif start <= done.high and done._ends:
                done._ends[-1] = end
            elif start <= done.floor:
                done.floor = end
            else:
                done._starts.append(start)
                done._ends.append(end)
        return done
