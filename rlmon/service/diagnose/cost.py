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
from bisect import bisect_left
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


@dataclass(frozen=True, slots=True)
class RunClock:
    """Seconds per step of a logged run (steps ascending), how they were told, and its GPUs."""

    steps: array[int]
    seconds: array[float]
    how: str
    gpus: float | None = None
    gpus_from: str = ""
    price: float | None = None  # per GPU-hour

    @property
    def total_seconds(self) -> float:
        return math.fsum(self.seconds)

    @property
    def seconds_per_step(self) -> float:
        return median(self.seconds) if self.seconds else 0.0

    def gpu_hours(self, seconds: float) -> float | None:
        return None if self.gpus is None else seconds * self.gpus / 3600

    def money(self, seconds: float) -> float | None:
        hours = self.gpu_hours(seconds)
        return None if hours is None or self.price is None else hours * self.price

    def span(self, first: int, last: int, words: str) -> SpanCost:
        """The steps ``first``..``last`` (inclusive)."""
        lo = bisect_left(self.steps, first)
        hi = bisect_left(self.steps, last + 1)
        seconds = math.fsum(self.seconds[lo:hi])
        return SpanCost(first, last, seconds, self.gpu_hours(seconds), self.money(seconds),
                        words)

    def describe(self, currency: str = "$") -> str:
        n = len(self.steps)
        text = (f"time: {n} steps, {_duration(self.total_seconds)} "
                f"({_duration(self.seconds_per_step)} a step; {self.how})")
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
        return {"steps": len(self.steps), "seconds": round(total, 3),
                "seconds_per_step": round(self.seconds_per_step, 6), "how": self.how,
                "gpus": self.gpus, "gpus_from": self.gpus_from,
                "gpu_hours": _round(self.gpu_hours(total)),
                "gpu_hours_per_step": _round(self.gpu_hours(self.seconds_per_step)),
                "price_per_gpu_hour": self.price, "money": _round(self.money(total))}


def _rows(run: LoggedRun) -> Iterator[tuple[int, Mapping[str, float]]]:
    if isinstance(run.rows, ColumnRows):
        yield from run.rows.rows()
    else:
        yield from run.rows.items()


def _find(keys: Iterable[str], wanted: tuple[str, ...]) -> str | None:
    return next((k for k in keys if k.removeprefix("train/") in wanted), None)


def _spread(points: list[tuple[int, float]]) -> tuple[array[int], array[float]] | None:
    """Per-step seconds from (step, timestamp) points: each gap shared evenly among the steps it
    spans; the first logged step gets the median step."""
    points = sorted(p for p in points if math.isfinite(p[1]))
    if len(points) < 2:
        return None
    steps: array[int] = array("q")
    seconds: array[float] = array("d")
    per_gap = []
    for (s0, t0), (s1, t1) in pairwise(points):
        if s1 <= s0 or t1 < t0:
            continue
        share = (t1 - t0) / (s1 - s0)
        per_gap.append(share)
        for step in range(s0 + 1, s1 + 1):
            steps.append(step)
            seconds.append(share)
    if not per_gap:
        return None
    steps.insert(0, points[0][0])
    seconds.insert(0, median(per_gap))
    return steps, seconds


def run_clock(run: LoggedRun, duration_key: str | None = None, gpus: float | None = None,
              price: float | None = None) -> RunClock | None:
    """The run's seconds per step from the first source it has (see the module's list), with
    its GPUs (``gpus``, else the world size the settings read) and price; None when the files
    say nothing of time. ``duration_key``: the logged key the key map took for
    ``perf/step_seconds``."""
    gpus_from = "--gpus" if gpus is not None else ""
    if gpus is None and run.settings.world_size is not None:
        gpus, gpus_from = float(run.settings.world_size), "the world size the settings read"
    found = _from_values(run, duration_key)
    if found is None:
        return None
    steps, seconds, how = found
    return RunClock(steps, seconds, how, gpus, gpus_from, price)


def _from_values(run: LoggedRun, duration_key: str | None,
                 ) -> tuple[array[int], array[float], str] | None:
    if run.records:
        points = [(r.step, r.time) for r in run.records if r.time is not None]
        spread = _spread([(s, float(t)) for s, t in points])
        return None if spread is None else (*spread, "the records' times")
    keys = run.keys
    duration = duration_key or _find(keys, _DURATION_KEYS)
    if duration is not None:
        steps, seconds = array("q"), array("d")
        for step, values in _rows(run):
            value = values.get(duration)
            if value is not None and math.isfinite(value) and value >= 0:
                steps.append(step)
                seconds.append(value)
        if steps:
            return steps, seconds, f"the logged {duration}"
    if run.times:
        spread = _spread(list(run.times.items()))
        if spread is not None:
            return (*spread, "TensorBoard event wall times")
    for wanted, how in ((_TIMESTAMP_KEYS, "W&B _timestamp"), (_RUNTIME_KEYS, "W&B _runtime")):
        key = _find(keys, wanted)
        if key is not None:
            spread = _spread([(s, v[key]) for s, v in _rows(run) if key in v])
            if spread is not None:
                return (*spread, how)
    total = _find(keys, _TOTAL_KEYS)
    if total is not None:
        seconds_total = next((v[total] for _, v in _rows(run) if total in v), None)
        if seconds_total is not None and math.isfinite(seconds_total) and len(run.rows):
            first, last = min(run.rows), max(run.rows)
            count = max(1, last - first + 1)
            steps = array("q", range(first, last + 1))
            return steps, array("d", [seconds_total / count]) * count, \
                f"{total} shared evenly over the steps"
    return None
