"""Goodput accounting: each rank's step time split into productive, overhead, idle and wasted.

Every nanosecond of a rank's step ``[start, end)`` lands in exactly one bucket, so the buckets of
a step add up to its ranks' time (times their GPUs):

- a span's time goes to its activity's bucket (:mod:`rlmon.service.goodput.buckets`); where
  spans nest, the innermost one that the map classifies wins; a ``step`` container is
  transparent;
- time in no span is **idle**, and *why* is derived from the other timelines of the run, not
  declared: while another rank of the same role was busy the rank waited for the slowest rank
  of its step (``straggler``); while another role generated, a trainer waited for rollouts
  (``rollouts``); while another role trained or synced weights, a rollout engine waited for
  weights (``weights``); while another role did other work, it waited on the pipeline
  (``pipeline``); while no rank of the run was in a span, ``unattributed`` (driver work, data
  loading);
- **wasted** is productive time thrown away: every productive and overhead second of a step
  that was discarded or rolled back, and of generation the share that went to prompt groups
  whose rewards all tie (``rollout/frac_reward_zero_std``: no advantage, no gradient) and to
  completions cut at the length limit (``rollout/clipped_ratio``, counted among the groups
  with spread: the two are taken as independent).

Times are integer nanoseconds per rank until the last multiplication by GPUs per rank, so a
bucket is exact to the nanosecond on the un-split data. Pure Python; the service runs it off
the training path (docs/goodput.md has the cost at 1,024 ranks).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, MutableMapping
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import numpy as np
from numpy.typing import NDArray

from rlmon.service.contract.timeline import RankTimeline, Timeline
from rlmon.service.goodput.buckets import Activity, Bucket, SpanMap

__all__ = [
    "IDLE_REASONS",
    "WASTED_REASONS",
    "Classified",
    "GoodputTotals",
    "Key",
    "RoleTimelines",
    "StepGoodput",
    "StepInput",
    "account_step",
    "busy_seconds",
    "mfu",
]

Key = tuple[str, Bucket, str]  # (role, bucket, reason)
Interval = tuple[int, int]

STRAGGLER, ROLLOUTS, WEIGHTS, PIPELINE, UNATTRIBUTED = (
    "straggler", "rollouts", "weights", "pipeline", "unattributed")
IDLE_REASONS = (STRAGGLER, ROLLOUTS, WEIGHTS, PIPELINE, UNATTRIBUTED)
DISCARDED, NO_SPREAD, TRUNCATED, ROLLED_BACK = (
    "discarded", "no_reward_spread", "truncated", "rolled_back")
WASTED_REASONS = (DISCARDED, ROLLED_BACK, NO_SPREAD, TRUNCATED)
_TRAINING = (Activity.TRAIN, Activity.WEIGHT_SYNC)


@dataclass(frozen=True, slots=True)
class RoleTimelines:
    """One role's ranks' timelines of one step, and the GPUs each rank holds."""

    role: str
    timelines: tuple[RankTimeline, ...]
    gpus_per_rank: float = 1.0


@dataclass(frozen=True, slots=True)
class StepInput:
    """Everything one step's accounting needs.

    ``roles``: the step's timelines, per role. ``neighbours``: timelines of the adjacent steps
    (of any role), only to say who was busy while a rank waited: a rollout engine waits for the
    weights of the trainer's *previous* step. ``discarded``: why the step's work was thrown
    away ('' when it was not); ``rolled_back``: a later attempt of the run ran the step again
    (its work counts as wasted ``rolled_back`` rather than ``discarded``).
    """

    run: str
    attempt: int
    step: int
    roles: tuple[RoleTimelines, ...]
    frac_reward_zero_std: float | None = None
    clipped_ratio: float | None = None
    discarded: str = ""
    neighbours: tuple[RoleTimelines, ...] = ()
    rolled_back: bool = False


@dataclass(frozen=True, slots=True)
class StepGoodput:
    """One step's GPU-seconds by (role, bucket, reason), the ranks and GPUs of each role, and
    the span names the map did not know (counted in ``goodput.unmapped_bucket``)."""

    run: str
    attempt: int
    step: int
    seconds: Mapping[Key, float]
    ranks: Mapping[str, int] = field(default_factory=dict)
    gpus: Mapping[str, float] = field(default_factory=dict)  # per role, all its ranks
    unmapped: tuple[str, ...] = ()

    def total(self, bucket: Bucket | None = None, role: str | None = None) -> float:
        return sum(v for (r, b, _), v in self.seconds.items()
                   if (bucket is None or b is bucket) and (role is None or r == role))

    def by_bucket(self) -> dict[Bucket, float]:
        return {b: self.total(b) for b in Bucket}

    @property
    def goodput(self) -> float:
        """Productive over all GPU-seconds (NaN for a step without time)."""
        total = self.total()
        return self.total(Bucket.PRODUCTIVE) / total if total > 0 else math.nan

    def to_json(self) -> dict[str, Any]:
        return {"run": self.run, "attempt": self.attempt, "step": self.step,
                "seconds": [[r, b.value, why, v] for (r, b, why), v in sorted(self.seconds.items())],
                "ranks": dict(self.ranks), "gpus": dict(self.gpus),
                "unmapped": list(self.unmapped)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StepGoodput:
        return cls(str(data["run"]), int(data["attempt"]), int(data["step"]),
                   {(r, Bucket(b), why): float(v) for r, b, why, v in data["seconds"]},
                   {k: int(v) for k, v in data["ranks"].items()},
                   {k: float(v) for k, v in data["gpus"].items()},
                   tuple(data.get("unmapped", ())))


@dataclass(slots=True)
class GoodputTotals:
    """GPU-seconds by (role, bucket, reason) added up over steps (a run, or a window of it)."""

    seconds: dict[Key, float] = field(default_factory=dict)
    steps: int = 0

    def add(self, step: StepGoodput) -> None:
        for key, value in step.seconds.items():
            self.seconds[key] = self.seconds.get(key, 0.0) + value
        self.steps += 1

    def total(self, bucket: Bucket | None = None) -> float:
        return sum(v for (_, b, _), v in self.seconds.items() if bucket is None or b is bucket)

    def by_bucket(self) -> dict[Bucket, float]:
        return {b: self.total(b) for b in Bucket}

    def by_reason(self) -> dict[tuple[Bucket, str], float]:
        out: dict[tuple[Bucket, str], float] = {}
        for (_, b, why), v in self.seconds.items():
            out[(b, why)] = out.get((b, why), 0.0) + v
        return out

    @property
    def goodput(self) -> float:
        total = self.total()
        return self.total(Bucket.PRODUCTIVE) / total if total > 0 else math.nan


def mfu(tokens: float, flops_per_token: float, gpu_seconds: float, peak_flops: float) -> float:
    """Model FLOPs utilisation: the model's FLOPs for ``tokens`` over what the GPUs could have
    done in ``gpu_seconds`` at their peak (NaN without time)."""
    capacity = gpu_seconds * peak_flops
    return tokens * flops_per_token / capacity if capacity > 0 else math.nan


# --- intervals -------------------------------------------------------------------------------


def _union(intervals: Iterable[Interval]) -> list[Interval]:
    out: list[Interval] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


class _Coverage:
    """Sorted, disjoint intervals, and how much of ``(-inf, x)`` they cover, for many ``x`` at
    once (integer nanoseconds: exact)."""

    __slots__ = ("before", "intervals", "lengths", "starts")

    def __init__(self, intervals: Iterable[Interval]) -> None:
        self.intervals = _union(intervals)
        self.starts = np.array([s for s, _ in self.intervals], dtype=np.int64)
        self.lengths = np.array([e - s for s, e in self.intervals], dtype=np.int64)
        self.before = np.concatenate(([0], np.cumsum(self.lengths))).astype(np.int64)

    def upto(self, x: NDArray[np.int64]) -> NDArray[np.int64]:
        if not len(self.starts):
            return np.zeros_like(x)
        i = np.searchsorted(self.starts, x, side="right") - 1
        j = np.maximum(i, 0)
        inside = np.clip(x - self.starts[j], 0, self.lengths[j])
        return np.where(i >= 0, self.before[j] + inside, 0)

    def within(self, a: NDArray[np.int64], b: NDArray[np.int64]) -> int:
        """Nanoseconds these intervals cover of each ``[a_k, b_k)``, summed over ``k``."""
        return int((self.upto(b) - self.upto(a)).sum())


@dataclass(slots=True)
class _Rank:
    ns: dict[Activity, int]
    busy: list[tuple[int, int, Activity]]
    gaps: list[Interval]
    unmapped: tuple[str, ...] = ()


Classified = MutableMapping[int, tuple[Timeline, _Rank]]  # id(timeline) -> (it, its split)


def _nested(items: list[tuple[int, int, int, Activity]],
            ) -> list[tuple[int, int, Activity]] | None:
    """Segments of spans that nest properly (sorted by start, longest first), the innermost
    one winning; None when two overlap without nesting (spans from several threads)."""
    segments: list[tuple[int, int, Activity]] = []
    stack: list[tuple[int, int, Activity]] = []  # (end, depth, activity), innermost last
    pos = 0

    def extend(end: int, activity: Activity) -> None:
        """[pos, end) goes to ``activity``, merged into the last segment where it continues it."""
        if segments and segments[-1][1] == pos and segments[-1][2] is activity:
            segments[-1] = (segments[-1][0], end, activity)
        else:
            segments.append((pos, end, activity))

    for s, e, depth, activity in items:
        while stack and stack[-1][0] <= s:
            end, _, done = stack.pop()
            if end > pos:
                extend(end, done)
            pos = end
        if stack:
            top_end, top_depth, top = stack[-1]
            if e > top_end or depth < top_depth:
                return None
            if s > pos:
                extend(s, top)
        pos = s
        stack.append((e, depth, activity))
    while stack:
        end, _, done = stack.pop()
        if end > pos:
            extend(end, done)
        pos = end
    return segments


def _painted(items: list[tuple[int, int, int, Activity]]) -> list[tuple[int, int, Activity]]:
    """Segments of any spans: between each pair of boundaries the deepest covering span wins
    (then the later start). Quadratic; only for spans that overlap without nesting."""
    segments: list[tuple[int, int, Activity]] = []
    cuts = sorted({p for s, e, _, _ in items for p in (s, e)})
    for a, b in pairwise(cuts):
        best: tuple[int, int, Activity] | None = None
        for s, e, depth, activity in items:
            if s >= b:
                break
            if e >= b and (best is None or (depth, s) > (best[0], best[1])):
                best = (depth, s, activity)
        if best is None:
            continue
        if segments and segments[-1][1] == a and segments[-1][2] is best[2]:
            segments[-1] = (segments[-1][0], b, best[2])
        else:
            segments.append((a, b, best[2]))
    return segments


def _by_start_longest_first(item: tuple[int, int, int, Activity]) -> tuple[int, int]:
    return item[0], -item[1]


def _by_start(item: tuple[int, int, int, Activity]) -> tuple[int, int]:
    return item[0], item[1]


def _classify(timeline: Timeline, spans: SpanMap, cache: Classified | None = None) -> _Rank:
    """Split one rank's step into its spans' activities (innermost wins) and its gaps
    (remembered in ``cache``: a step's timelines are its neighbours' context twice more)."""
    if cache is not None:
        known = cache.get(id(timeline))
        if known is not None and known[0] is timeline:
            return known[1]
    lo, hi = timeline.start_ns, timeline.end_ns
    unmapped: set[str] = set()
    items: list[tuple[int, int, int, Activity]] = []
    lookup = spans.activity
    container, other = Activity.STEP, Activity.OTHER
    for span in timeline.spans:
        activity = lookup(span.name)
        if activity is container:
            continue
        if activity is other:
            unmapped.add(span.name)
        s = span.start_ns if span.start_ns > lo else lo
        e = span.end_ns if span.end_ns < hi else hi
        if e > s:
            items.append((s, e, span.depth, activity))
    items.sort(key=_by_start_longest_first)
    segments = _nested(items)
    if segments is None:
        segments = _painted(sorted(items, key=_by_start))
    ns: dict[Activity, int] = {}
    gaps: list[Interval] = []
    cur = lo
    for s, e, activity in segments:
        ns[activity] = ns.get(activity, 0) + (e - s)
        if s > cur:
            gaps.append((cur, s))
        if e > cur:
            cur = e
    if hi > cur:
        gaps.append((cur, hi))
    rank = _Rank(ns, segments, gaps, tuple(sorted(unmapped)))
    if cache is not None:
        cache[id(timeline)] = (timeline, rank)
    return rank


def busy_seconds(timeline: Timeline, spans: SpanMap) -> float:
    """Seconds of the rank's step in classified spans (a ``step`` container is not work)."""
    return sum(_classify(timeline, spans).ns.values()) * 1e-9


def _unions(ranks: list[_Rank]) -> tuple[list[Interval], list[Interval], list[Interval]]:
    """(any busy, generating, training or syncing weights) of a set of ranks."""
    gen, training = Activity.GENERATE, _TRAINING
    busy = _union([(s, e) for r in ranks for s, e, _ in r.busy])
    generating = _union([(s, e) for r in ranks for s, e, a in r.busy if a is gen])
    updating = _union([(s, e) for r in ranks for s, e, a in r.busy if a in training])
    return busy, generating, updating


def account_step(data: StepInput, spans: SpanMap, cache: Classified | None = None,
                 ) -> StepGoodput:
    """The step's GPU-seconds by (role, bucket, reason); see the module docstring. ``cache``
    keeps each timeline's split between calls (the caller bounds it)."""
    ranks = {rt.role: [_classify(t.timeline, spans, cache) for t in rt.timelines]
             for rt in data.roles}
    unmapped = {name for rs in ranks.values() for r in rs for name in r.unmapped}
    context: dict[str, list[_Rank]] = {role: list(rs) for role, rs in ranks.items()}
    for rt in data.neighbours:
        context.setdefault(rt.role, []).extend(
            _classify(t.timeline, spans, cache) for t in rt.timelines)
    per_role = {role: _unions(rs) for role, rs in context.items()}
    seconds: dict[Key, float] = {}
    counts: dict[str, int] = {}
    gpus: dict[str, float] = {}
    zero_std = _fraction(data.frac_reward_zero_std)
    clipped = _fraction(data.clipped_ratio)
    for rt in data.roles:
        role = rt.role
        others = [per_role[r] for r in per_role if r != role]
        generates = any(Activity.GENERATE in r.ns for r in ranks[role])
        same = _union([(s, e) for r in ranks[role] for s, e, _ in r.busy])
        first = [i for u in others for i in u[2 if generates else 1]]
        other_busy = [i for u in others for i in u[0]]
        ns: dict[tuple[Bucket, str], int] = {}
        for rank in ranks[role]:
            for activity, value in rank.ns.items():
                bucket = spans.bucket(activity)
                assert bucket is not None
                kind = (bucket, activity.value)
                ns[kind] = ns.get(kind, 0) + value
        # idle, by precedence: a peer of the role busy, then the role it waits for (rollouts
        # or weights), then any other role, then nobody
        starts = np.array([g[0] for r in ranks[role] for g in r.gaps], dtype=np.int64)
        ends = np.array([g[1] for r in ranks[role] for g in r.gaps], dtype=np.int64)
        peers = _Coverage(same).within(starts, ends)
        awaited = _Coverage(same + first).within(starts, ends)
        anyone = _Coverage(same + other_busy).within(starts, ends)
        for why, value in ((STRAGGLER, peers),
                           (WEIGHTS if generates else ROLLOUTS, awaited - peers),
                           (PIPELINE, anyone - awaited),
                           (UNATTRIBUTED, int((ends - starts).sum()) - anyone)):
            if value:
                ns[(Bucket.IDLE, why)] = value
        g = rt.gpus_per_rank * 1e-9
        out = {(role, b, why): value * g for (b, why), value in ns.items()}
        if data.discarded or data.rolled_back:
            for (b, why), value in ns.items():
                if b in (Bucket.PRODUCTIVE, Bucket.OVERHEAD):
                    del out[(role, b, why)]
                    key = (role, Bucket.WASTED, ROLLED_BACK if data.rolled_back else DISCARDED)
                    out[key] = out.get(key, 0.0) + value * g
        else:
            gen = ns.get((Bucket.PRODUCTIVE, Activity.GENERATE.value), 0) * g
            lost_spread = gen * zero_std
            lost_cut = gen * (1.0 - zero_std) * clipped
            if lost_spread:
                out[(role, Bucket.WASTED, NO_SPREAD)] = lost_spread
            if lost_cut:
                out[(role, Bucket.WASTED, TRUNCATED)] = lost_cut
            if gen:
                out[(role, Bucket.PRODUCTIVE, Activity.GENERATE.value)] = (
                    gen - lost_spread - lost_cut)
        seconds.update(out)
        counts[role] = len(rt.timelines)
        gpus[role] = len(rt.timelines) * rt.gpus_per_rank
    return StepGoodput(data.run, data.attempt, data.step, seconds, counts, gpus,
                       tuple(sorted(unmapped)))


def _fraction(value: float | None) -> float:
    if value is None or not math.isfinite(value):
        return 0.0
    return min(max(value, 0.0), 1.0)

