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

The first steps have no period yet, so they are judged by what the run has said so far
(:func:`early_deadline`): once step 0 finalized, ``max(k x its duration, floor)`` from it, the
stages it timed bounding the same stages after it; before that, the spans open now. A span's
name says whether a long wait is expected: loading, compiling, warming up, the first generation
of a cold engine (``cold``: an hour by default, and only the first time the run enters a stage
of that name) or not: a weight sync, a collective, a broadcast (``sync``: five minutes).

Saving, evaluating and uploading (``save``) have their own allowance wherever they happen
(``save_span_seconds``, 30 minutes): a checkpoint every 100 steps is not a stall. A run that said
its planned number of steps and reached it is ending: its final save, evaluation or upload may
take ``final_seconds`` (an hour) before the silence pages (:func:`ending_deadline`).
"""

from __future__ import annotations

import functools
import re
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from statistics import median
from types import MappingProxyType

from rlmon.service.contract.heartbeat import OpenSpan

__all__ = ["BOUNDS", "COLD_SPAN_WORDS", "SAVE_SPAN_WORDS", "SYNC_SPAN_WORDS", "LivenessParams",
           "SpanKind", "StepPeriods", "early_deadline", "ending_deadline", "span_kind"]

# Words in a span's name that say a long first wait is expected, or that it is not. Matched as
# whole words of the name split at anything not a letter or digit ("rollout/generate",
# "load_model", "sync-weights"); a word counts when the name's word starts with it ("compiling",
# "loading", "generation", "broadcasting").
COLD_SPAN_WORDS = ("load", "loading", "compile", "compiling", "warmup", "warm", "init",
                   "initialize", "startup", "capture", "cudagraph", "download", "restore",
                   "generate", "generation", "rollout", "sample", "sampling")
SYNC_SPAN_WORDS = ("sync", "weight_sync", "broadcast", "allreduce", "all_reduce", "allgather",
                   "all_gather", "reduce_scatter", "barrier", "collective", "nccl", "gloo")
SAVE_SPAN_WORDS = ("save", "saving", "checkpoint", "ckpt", "eval", "evaluate", "evaluation",
                   "upload", "push_to_hub", "export")


class SpanKind(StrEnum):
    COLD = "cold"  # a long first wait is expected: loading, compiling, a cold engine's first go
    SYNC = "sync"  # never long: a weight sync, a collective
    SAVE = "save"  # a save, an evaluation, an upload: long by nature, wherever it happens
    OTHER = "other"  # the name says neither


_WORD = re.compile(r"[a-z0-9]+")


def _words(name: str) -> list[str]:
    return _WORD.findall(name.lower())


def span_kind(name: str, cold: Sequence[str] = COLD_SPAN_WORDS,
              sync: Sequence[str] = SYNC_SPAN_WORDS,
              save: Sequence[str] = SAVE_SPAN_WORDS) -> SpanKind:
    """A span's kind from its name; ``cold`` wins a tie, then ``save`` (a wait the name allows
    is never paged early). Multi-word entries ("weight_sync") match consecutive words."""
    words = _words(name)

    def has(entries: Sequence[str]) -> bool:
        for entry in entries:
            parts = _words(entry)
            n = len(parts)
            for i in range(len(words) - n + 1):
                if words[i:i + n - 1] == parts[:-1] and words[i + n - 1].startswith(parts[-1]):
                    return True
        return False

    if has(cold):
        return SpanKind.COLD
    if has(save):
        return SpanKind.SAVE
    return SpanKind.SYNC if has(sync) else SpanKind.OTHER


# The liveness timer asks for the kind of every open span of every stream each second: a run's
# few span names are split into words once, not at every evaluation.
_span_kind_of = functools.lru_cache(maxsize=4096)(span_kind)


# field -> (its lower bound, whether the bound itself is allowed); the config's liveness section
# takes its bounds from here. A slow factor of 1 would call every run slow; GPUs per rank may be
# 0 (a CPU role).
BOUNDS: Mapping[str, tuple[float, bool]] = MappingProxyType({
    **{name: (0.0, False) for name in (
        "heartbeat_seconds", "stall_factor", "stall_floor_seconds", "first_step_seconds",
        "cold_span_seconds", "sync_span_seconds", "save_span_seconds", "final_seconds",
        "dead_after_seconds", "stuck_factor", "stuck_floor_seconds", "evaluate_seconds")},
    "slow_factor": (1.0, False), "slow_steps": (1, True), "window": (3, True),
    "baseline_window": (8, True), "gpus_per_rank": (0.0, True)})


@dataclass(frozen=True, slots=True)
class LivenessParams:
    heartbeat_seconds: float = 5.0  # how often a Reporter's sender thread heartbeats
    stall_factor: float = 4.0  # k: stalled after k typical step periods without a step
    stall_floor_seconds: float = 90.0  # ... and never before this
    max_interval_margin: float = 1.25  # ... nor before this x the longest recent interval
    first_step_seconds: float = 3600.0  # before step 0 finalized, outside any span that says
    cold_span_seconds: float = 3600.0  # the first time in a cold span (loading, compiling, ...)
    sync_span_seconds: float = 300.0  # in a sync span (a weight sync, a collective) before step 0
    save_span_seconds: float = 1800.0  # in a save span (a checkpoint, an evaluation), anywhere
    final_seconds: float = 3600.0  # after the planned last step: the final save, eval, upload
    cold_span_words: Sequence[str] = COLD_SPAN_WORDS
    sync_span_words: Sequence[str] = SYNC_SPAN_WORDS
    save_span_words: Sequence[str] = SAVE_SPAN_WORDS
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
        """The bounds, stated here only: the config's ``liveness`` section is checked by building
        this (:class:`rlmon.service.config.LivenessConfig`)."""
        for name, (low, allowed) in BOUNDS.items():
            value = getattr(self, name)
            if not (value >= low if allowed else value > low):
                raise ValueError(f"liveness.{name} must be {'>=' if allowed else '>'} {low:g}, "
                                 f"got {value!r}")
        for name in ("cold_span_words", "sync_span_words", "save_span_words"):
            words = getattr(self, name)
            if isinstance(words, str) or not all(isinstance(w, str) and _words(w) for w in words):
                raise ValueError(f"liveness.{name} must be a list of words, got {words!r}")
            object.__setattr__(self, name, tuple(words))  # a config's list, kept immutable

    def kind(self, name: str) -> SpanKind:
        return _span_kind_of(name, tuple(self.cold_span_words), tuple(self.sync_span_words),
                             tuple(self.save_span_words))

    @property
    def ask_ray_after(self) -> float:
        """Silence after which a rank's process is asked about (two heartbeats missed): Ray
        knows an actor's end within a second, so its answer need not wait for the dead limit."""
        return min(self.dead_after_seconds, 2.0 * self.heartbeat_seconds)


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

    def stall_threshold(self, params: LivenessParams, steps: int,
                        step0_seconds: float | None = None) -> float:
        """Seconds without a finalized step before the stream is stalled (from two finalized
        steps on; before that :func:`early_deadline` decides). With one interval only, step 0's
        duration bounds it too: the shorter of the two is the pace (step 0 may hold a model
        load, step 1 a one-off slow batch), the margin over the longest interval stays."""
        if steps < 2 or not self.recent:
            return max(params.first_step_seconds, params.stall_floor_seconds)
        # the last three intervals too: once a slowdown is three steps old, the stall threshold
        # follows the new pace at once instead of paging every slow step until the median does
        typical = max(median(self.recent), median(list(self.recent)[-3:]))
        if len(self.recent) == 1 and step0_seconds is not None and step0_seconds > 0:
            typical = min(typical, step0_seconds)
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


def _span_allowance(span: OpenSpan, params: LivenessParams, usual: Mapping[str, float],
                    before_step0: bool) -> float | None:
    """How long a rank may stay in ``span`` in a run's first steps (None: the span says
    nothing). A stage the run has timed is bounded by its own duration; a cold stage the run
    never finished gets the cold allowance; a sync span, before step 0, the sync allowance."""
    known = usual.get(span.name)
    if known is not None:
        return max(params.stuck_factor * known, params.stall_floor_seconds)
    kind = params.kind(span.name)
    if kind is SpanKind.COLD:
        return params.cold_span_seconds
    if kind is SpanKind.SAVE:
        return params.save_span_seconds
    if before_step0:
        return params.sync_span_seconds if kind is SpanKind.SYNC else params.first_step_seconds
    return None


def early_deadline(params: LivenessParams, progress: float, step0_seconds: float | None,
                   ranks: Iterable[tuple[OpenSpan, ...]], usual: Mapping[str, float]) -> float:
    """When a stream that has not finalized two steps is stalled (unix seconds).

    ``progress``: when step 0 finalized, else when the stream was first heard;
    ``step0_seconds``: step 0's duration (None: step 0 has not finalized, or came without a
    timeline); ``ranks``: the open spans of each live rank, outermost first.

    With step 0's duration: ``max(k x it, floor)`` after it, later only for a rank inside a
    stage that may take longer (a cold stage entered for the first time, a timed stage within
    its own bound). Without it, each live rank's spans decide (the longest allowance of any
    span it is in, from the span's start: a broadcast inside ``load_model`` waits for the
    load), a rank in no span ``first_step_seconds``; the run is stalled when every live rank is
    past its allowance.
    """
    if step0_seconds is not None:
        deadline = progress + max(params.stall_factor * step0_seconds,
                                  params.stall_floor_seconds)
        for spans in ranks:
            for span in spans:
                allowance = _span_allowance(span, params, usual, before_step0=False)
                if allowance is not None:
                    deadline = max(deadline, span.since + allowance)
        return deadline
    latest: float | None = None
    for spans in ranks:
        allowances = [span.since + a for span in spans
                      if (a := _span_allowance(span, params, usual, before_step0=True))
                      is not None]
        rank = max(allowances) if allowances else progress + params.first_step_seconds
        latest = rank if latest is None else max(latest, rank)
    if latest is None:
        return progress + params.first_step_seconds
    return max(latest, progress + params.stall_floor_seconds)


def ending_deadline(params: LivenessParams, progress: float, reached_end: bool,
                    ranks: Iterable[tuple[OpenSpan, ...]]) -> float | None:
    """The latest a stream may stay without a step for its saves and its end (unix seconds;
    None: neither applies): a live rank inside a save span (a checkpoint, an evaluation, an
    upload) until ``save_span_seconds`` after the span opened, wherever in the run it is; and a
    run that reached its planned last step until ``final_seconds`` after it. Past either the
    silence is a stall again: a hung final save still pages, later."""
    deadline = progress + params.final_seconds if reached_end else None
    for spans in ranks:
        for span in spans:
            if params.kind(span.name) is SpanKind.SAVE:
                end = span.since + params.save_span_seconds
                deadline = end if deadline is None else max(deadline, end)
    return deadline
