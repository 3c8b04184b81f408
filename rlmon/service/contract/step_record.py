"""StepRecord: what one (run, role, step) finalizes to."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rlmon.service.contract.timeline import RankTimeline, Straggler
from rlmon.service.metrics.nonfinite import nonfinite_name
from rlmon.service.metrics.rank import Rank
from rlmon.service.metrics.ranked_forms import Sample

__all__ = ["StepIdentity", "StepKey", "StepRecord", "json_number"]

StepKey = tuple[str, str, int]  # (run, role, step)
StepIdentity = tuple[str, str, int, int]  # (run, role, attempt, step): unique across reruns


def json_number(value: float | None) -> float | None:
    """JSON has no NaN or Infinity: non-finite values travel as null (see ``nonfinite``)."""
    if value is None or not math.isfinite(value):
        return None
    return value


@dataclass(frozen=True, slots=True)
class StepRecord:
    """The aggregated values of one step of one role of one run.

    ``metrics`` holds every metric that was defined in the step (a mean over zero tokens is left
    out: absent is not zero); NaN and Inf are kept as floats. ``attempt`` counts the restarts of
    the (run, role): a new run under an existing name starts attempt 1, 2, ... (0 is the first).
    ``timelines`` are the ranks' step timelines (not part of the replay line; the history store
    keeps them apart), ``timelines_cut`` the spans and timelines that did not fit their bounds,
    ``straggler`` the slowest rank and the span behind it. ``samples`` holds, per ranked metric
    (the ``top``/``bottom`` forms), its best items, best first (not part of the replay line
    either: payloads are user text, kept by the history store within its bounds).
    """

    #: The run's name, as the Reporters said it.
    run: str
    #: The role within the run (``actor``, ``rollout``, ...).
    role: str
    #: The training step.
    step: int
    #: Whether every rank of the world sent its final record (else finalized by a deadline or
    #: at the end of input, with ``missing_ranks``).
    complete: bool
    #: The world's size: how many ranks were expected.
    ranks_expected: int
    #: How many ranks sent their final record.
    ranks_reporting: int
    #: The ranks that did not (the first ``MAX_LISTED_MISSING`` of them).
    missing_ranks: tuple[Rank, ...]
    #: Metric name -> value, merged over every rank once; NaN and Inf kept as floats.
    metrics: Mapping[str, float]
    #: Metrics whose replicated copies (e.g. over CP) disagreed beyond the tolerance.
    replica_mismatches: tuple[str, ...] = ()
    #: Monotonic seconds when the step's first record arrived (the assembler's clock).
    first_seen: float | None = None
    #: Unix seconds when the step was finalized (the history store's retention reads it).
    finalized_at: float | None = None
    #: The latest unix time the ranks' records carried (when the step happened).
    time: float | None = field(default=None)
    #: 0 for the first attempt of (run, role), 1, 2, ... for reruns under the same name.
    attempt: int = 0
    #: Each rank's timeline of the step, by rank (bounded per step).
    timelines: tuple[RankTimeline, ...] = ()
    #: Timeline spans and timelines that did not fit their bounds (counted, not kept).
    timelines_cut: int = 0
    #: The slowest rank and the span behind it (None: no timelines).
    straggler: Straggler | None = None
    #: Per ranked metric (``top``/``bottom`` forms), its best items, best first.
    samples: Mapping[str, tuple[Sample, ...]] = field(default_factory=dict)
    #: Per metric reported by two ranks or more, the lowest and highest rank's own value (each
    #: rank's statistic over its own records: its token-weighted mean, its sum; one copy per
    #: replica group), NaN and Inf kept as floats (not part of the replay line).
    rank_extremes: Mapping[str, tuple[float, float]] = field(default_factory=dict)

    @property
    def key(self) -> StepKey:
        return (self.run, self.role, self.step)

    @property
    def identity(self) -> StepIdentity:
        return (self.run, self.role, self.attempt, self.step)

    def to_json(self) -> dict[str, Any]:
        """The replay line (docs/design.md, "The replay contract"); ``nonfinite`` is added only
        when some value is NaN/Inf."""
        line: dict[str, Any] = {
            "type": "step",
            "run": self.run,
            "role": self.role,
            "step": self.step,
            "complete": self.complete,
            "ranks_expected": self.ranks_expected,
            "ranks_reporting": self.ranks_reporting,
            "missing_ranks": [rank.as_dict() for rank in self.missing_ranks],
            "metrics": {name: json_number(v) for name, v in self.metrics.items()},
        }
        if len(self.missing_ranks) < self.ranks_expected - self.ranks_reporting:
            line["missing_ranks_truncated"] = True
        nonfinite = {n: nonfinite_name(v) for n, v in self.metrics.items() if not math.isfinite(v)}
        if nonfinite:
            line["nonfinite"] = nonfinite
        if self.replica_mismatches:
            line["replica_mismatches"] = list(self.replica_mismatches)
        if self.attempt:
            line["attempt"] = self.attempt
        return line
