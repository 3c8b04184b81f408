"""What a logged run's steps took and cost, from what its files carry, and each finding's share.

A log has no step timelines (rlmon's goodput needs those), but most formats say when or how long:

1. a per-step duration the run logged: its framework's step time (verl ``timing_s/step``, SkyRL
   ``timing/step``, mapped to ``perf/step_seconds``) or TRL's ``step_time``;
2. when each step was logged: TensorBoard's event wall times, W&B's ``_timestamp`` (or its
   ``_runtime``, seconds since the start), the ``time`` of rlmon's own records; consecutive
   logged steps are differenced and the time shared evenly among the steps between them (a run
   that logs every N steps);
3. the Trainer's ``train_runtime`` in a ``trainer_state.json``'s closing entry, shared evenly.

With the run's GPUs (``--gpus``, else the world size its settings record) a step's GPU-hours
are its seconds x GPUs / 3600; a finding's span (from the step its condition began to the step it
resolved, or the run's end) costs the GPU-hours of its steps, priced at ``--price-per-gpu-hour``.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_right
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from itertools import pairwise
from statistics import median
from typing import Any

from rlmon.service.diagnose.columns import ColumnRows
from rlmon.service.diagnose.logged_run import LoggedRun

__all__ = ["NO_CLOCK", "RunClock", "SpanCost", "no_clock", "run_clock", "span_words"]

_DURATION_KEYS = ("step_time",)  # TRL's per-step wall time (bare; a tracker may prefix train/)
_TIMESTAMP_KEYS = ("_timestamp",)  # W&B: unix seconds of the log call
_RUNTIME_KEYS = ("_runtime",)  # W&B: seconds since the run started
_TOTAL_KEYS = ("train_runtime",)  # the Trainer's closing summary: seconds for the whole run

# how a finding's span is named
_SPAN_WORDS = {
    "NoLearningSignal": "wasted while no learning signal",
    "LearningSignalFading": "while the learning signal faded",
    "EntropyCollapse": "while collapsed",
    "EntropySliding": "while entropy slid",
    "NonFiniteMetric": "while values were NaN or Inf",
    "RewardStuck": "while the reward was stuck",
}


# why a log's findings cannot be priced: said once, in place of a cost
NO_CLOCK = ("not priced: the log says nothing of time (no logged step time such as step_time "
            "or timing_s/step, no TensorBoard wall times, no W&B _timestamp or _runtime, no "
            "train_runtime)")


def no_clock(gpus: float | None, price: float | None) -> str:
    """The sentence for a log without step times, naming what was given to price with."""
    given = [f"--gpus {gpus:g}" if gpus is not None else "",
             f"--price-per-gpu-hour {price:g}" if price is not None else ""]
    given = [g for g in given if g]
    return NO_CLOCK + (f", so {' and '.join(given)} price nothing" if given else "")


def span_words(alert: str) -> str:
    return _SPAN_WORDS.get(alert, "while it held")


@dataclass(frozen=True, slots=True)
class SpanCost:
    """What a finding's span cost: steps ``first``..``last``."""

    first: int
    last: int
    seconds: float
    gpu_hours: float | None
    money: float | None
    words: str

    def describe(self, currency: str = "$") -> str:
        text = f"steps {self.first}-{self.last}, {_duration(self.seconds)}"
        if self.gpu_hours is not None:
            text += f", {self.gpu_hours:.3g} GPU-hours"
        if self.money is not None:
            text += f" (about {currency}{self.money:,.2f})"
        return f"{text} {self.words}"

    def to_json(self) -> dict[str, Any]:
        return {"first_step": self.first, "last_step": self.last,
                "seconds": round(self.seconds, 3), "gpu_hours": _round(self.gpu_hours),
                "money": _round(self.money), "words": self.words}


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 6)


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.3g} s"


# Bounds on the times a log may tell (a time outside them is refused by name, never priced): a
# unix time or a run's elapsed seconds within ~300 years, and a step within a year.
MAX_TIME_SECONDS = 1e10
MAX_STEP_SECONDS = 366 * 86_400.0


@dataclass(frozen=True, slots=True)
class RunClock:
    """Seconds per step of a logged run, how they were told, and its GPUs.

    The steps are held as runs of equal seconds (``firsts[i]``, ``counts[i]`` steps from it,
    ``each[i]`` seconds a step; ascending, not overlapping): a gap between two logged steps is
    one run whatever its length, so steps 1 and 2^53-1 cost two entries, not 2^53.
    """

    firsts: array[int]
    counts: array[int]
    each: array[float]
    how: str
    gpus: float | None = None
    gpus_from: str = ""
    price: float | None = None  # per GPU-hour
    refused: tuple[str, ...] = ()  # times the files told that are not times, by field and step

    @property
    def steps(self) -> int:
        """How many steps the clock covers."""
        return sum(self.counts)

    @property
    def last_step(self) -> int | None:
        return self.firsts[-1] + self.counts[-1] - 1 if self.firsts else None

    @property
    def total_seconds(self) -> float:
        return math.fsum(c * e for c, e in zip(self.counts, self.each, strict=True))

    @property
    def seconds_per_step(self) -> float:
        """The median step's seconds (the runs weighted by their lengths)."""
        total = self.steps
        if not total:
            return 0.0
        ordered = sorted(zip(self.each, self.counts, strict=True))

        def nth(index: int) -> float:
            for seconds, count in ordered:
                if index < count:
                    return seconds
                index -= count
            return ordered[-1][0]

        middle = total // 2
        return nth(middle) if total % 2 else (nth(middle - 1) + nth(middle)) / 2

    def gpu_hours(self, seconds: float) -> float | None:
        return None if self.gpus is None else seconds * self.gpus / 3600

    def money(self, seconds: float) -> float | None:
        hours = self.gpu_hours(seconds)
        return None if hours is None or self.price is None else hours * self.price

    def span(self, first: int, last: int, words: str) -> SpanCost:
        """The steps ``first``..``last`` (inclusive)."""
        parts = []
        for index in range(max(0, bisect_right(self.firsts, first) - 1), len(self.firsts)):
            start = self.firsts[index]
            if start > last:
                break
            end = start + self.counts[index] - 1
            inside = min(end, last) - max(start, first) + 1
            if inside > 0:
                parts.append(inside * self.each[index])
        seconds = math.fsum(parts)
        return SpanCost(first, last, seconds, self.gpu_hours(seconds), self.money(seconds),
                        words)

    def describe(self, currency: str = "$") -> str:
        text = (f"time: {self.steps} steps, {_duration(self.total_seconds)} "
                f"({_duration(self.seconds_per_step)} a step; {self.how})")
        if self.refused:
            more = f" and {len(self.refused) - 1} more" if len(self.refused) > 1 else ""
            text += f"; refused {self.refused[0]}{more}"
        if self.gpus is None:
            return text + "; GPUs unknown (give --gpus) so no GPU-hours"
        hours = self.gpu_hours(self.total_seconds) or 0.0
        text += (f"; {self.gpus:g} GPUs ({self.gpus_from}): {hours:.3g} GPU-hours, "
                 f"{(self.gpu_hours(self.seconds_per_step) or 0.0):.3g} a step")
        if self.price is not None:
            text += f", about {currency}{hours * self.price:,.2f} at {currency}{self.price:g}" \
                    "/GPU-hour"
        return text

    def to_json(self) -> dict[str, Any]:
        total = self.total_seconds
        return {"steps": self.steps, "seconds": round(total, 3),
                "seconds_per_step": round(self.seconds_per_step, 6), "how": self.how,
                "gpus": self.gpus, "gpus_from": self.gpus_from,
                "gpu_hours": _round(self.gpu_hours(total)),
                "gpu_hours_per_step": _round(self.gpu_hours(self.seconds_per_step)),
                "price_per_gpu_hour": self.price, "money": _round(self.money(total)),
                "refused": list(self.refused)}


class _Runs:
    """Runs of equal step seconds being built in ascending step order."""

    def __init__(self) -> None:
        self.firsts: array[int] = array("q")
        self.counts: array[int] = array("q")
        self.each: array[float] = array("d")

    def add(self, first: int, count: int, seconds: float) -> None:
        self.firsts.append(first)
        self.counts.append(count)
        self.each.append(seconds)


class _Refusals:
    """Times that are not times, named by field and step (a few kept, all counted)."""

    KEEP = 5

    def __init__(self) -> None:
        self.kept: list[str] = []
        self.count = 0

    def check(self, value: float, field: str, step: int, high: float) -> bool:
        if math.isfinite(value) and 0 <= value <= high:
            return True
        if math.isnan(value):  # a value not logged at that step: nothing to refuse
            return False
        self.count += 1
        if len(self.kept) < self.KEEP:
            self.kept.append(f"{field} at step {step}: {value:g} is not a time in seconds "
                             f"(0 to {high:g})")
        return False

    def notes(self) -> tuple[str, ...]:
        extra = self.count - len(self.kept)
        return tuple(self.kept) + ((f"{extra} more",) if extra > 0 else ())


def _rows(run: LoggedRun) -> Iterator[tuple[int, Mapping[str, float]]]:
    if isinstance(run.rows, ColumnRows):
        yield from run.rows.rows()
    else:
        yield from run.rows.items()


def _find(keys: Iterable[str], wanted: tuple[str, ...]) -> str | None:
    return next((k for k in keys if k.removeprefix("train/") in wanted), None)


def _spread(points: list[tuple[int, float]], field: str, refusals: _Refusals,
            ) -> _Runs | None:
    """Per-step seconds from (step, time) points: each gap shared evenly among the steps it
    spans (one run of steps, whatever the gap's length); the first logged step gets the median
    step. A time outside ``MAX_TIME_SECONDS``, or a gap whose steps would each take longer
    than ``MAX_STEP_SECONDS``, is refused by name."""
    points = sorted(p for p in points if refusals.check(p[1], field, p[0], MAX_TIME_SECONDS))
    if len(points) < 2:
        return None
    gaps: list[tuple[int, int, float]] = []
    for (s0, t0), (s1, t1) in pairwise(points):
        if s1 <= s0 or t1 < t0:
            continue
        share = (t1 - t0) / (s1 - s0)
        if refusals.check(share, f"the {field} gap before", s1, MAX_STEP_SECONDS):
            gaps.append((s0 + 1, s1 - s0, share))
    if not gaps:
        return None
    runs = _Runs()
    runs.add(points[0][0], 1, median(share for _, _, share in gaps))
    for first, count, share in gaps:
        runs.add(first, count, share)
    return runs


def run_clock(run: LoggedRun, duration_key: str | None = None, gpus: float | None = None,
              price: float | None = None) -> RunClock | None:
    """The run's seconds per step from the first source it has (see the module's list), with
    its GPUs (``gpus``, else the world size the settings read) and price; None when the files
    say nothing of time. ``duration_key``: the logged key the key map took for
    ``perf/step_seconds``."""
    gpus_from = "--gpus" if gpus is not None else ""
    if gpus is None and run.settings.world_size is not None:
        gpus, gpus_from = float(run.settings.world_size), "the world size the settings read"
    refusals = _Refusals()
    found = _from_values(run, duration_key, refusals)
    if found is None:
        return None
    runs, how = found
    return RunClock(runs.firsts, runs.counts, runs.each, how, gpus, gpus_from, price,
                    refusals.notes())


def _from_values(run: LoggedRun, duration_key: str | None, refusals: _Refusals,
                 ) -> tuple[_Runs, str] | None:
    if run.records:
        points = [(r.step, float(r.time)) for r in run.records if r.time is not None]
        spread = _spread(points, "time", refusals)
        return None if spread is None else (spread, "the records' times")
    keys = run.keys
    duration = duration_key or _find(keys, _DURATION_KEYS)
    if duration is not None:
        runs = _Runs()
        for step, values in _rows(run):  # ascending, as every reader keeps its rows
            value = values.get(duration)
            if value is not None and (not runs.firsts or step > runs.firsts[-1]) \
                    and refusals.check(value, duration, step, MAX_STEP_SECONDS):
                runs.add(step, 1, value)
        if runs.firsts:
            return runs, f"the logged {duration}"
    if run.times:
        spread = _spread(list(run.times.items()), "TensorBoard wall time", refusals)
        if spread is not None:
            return spread, "TensorBoard event wall times"
    for wanted, how in ((_TIMESTAMP_KEYS, "W&B _timestamp"), (_RUNTIME_KEYS, "W&B _runtime")):
        key = _find(keys, wanted)
        if key is not None:
            spread = _spread([(s, v[key]) for s, v in _rows(run) if key in v], key, refusals)
            if spread is not None:
                return spread, how
    total = _find(keys, _TOTAL_KEYS)
    if total is not None:
        found = next(((s, v[total]) for s, v in _rows(run) if total in v), None)
        if found is not None and len(run.rows) and refusals.check(
                found[1], total, found[0], MAX_TIME_SECONDS):
            first, last = min(run.rows), max(run.rows)
            count = max(1, last - first + 1)
            runs = _Runs()
            runs.add(first, count, found[1] / count)
            return runs, f"{total} shared evenly over the steps"
    return None
