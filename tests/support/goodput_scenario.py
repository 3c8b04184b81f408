"""A synthetic GRPO step with known buckets, and an independent numpy reference for them.

Step 5 of run ``synthetic``: two rollout engines (one slower), a reward worker, four trainer
ranks (one a straggler, one with a checkpoint nested in its update and a ``step`` container
around its whole step), a span no map knows, a quarter of the prompt groups with tied rewards
and a tenth of the completions truncated. Step 6 repeats it, discarded (its optimizer step was
skipped). Times are odd microseconds on a unix-nanosecond base, so nothing rounds to a
millisecond by luck.

The reference paints every rank's step microsecond by microsecond (innermost span last) and
derives idle from boolean "who is busy" arrays: a different algorithm from the accounting's
interval sweep, on the same un-split data.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rlmon.service.contract.timeline import RankTimeline, Span, Timeline
from rlmon.service.goodput.accounting import RoleTimelines, StepInput
from rlmon.service.goodput.buckets import ACTIVITY_BUCKET, Activity, Bucket, SpanMap
from rlmon.service.metrics.rank import Rank

__all__ = ["BASE_NS", "CLIPPED", "FRAC_ZERO_STD", "reference", "step_input", "step_roles"]

BASE_NS = 1_700_000_000_000_000_000
FRAC_ZERO_STD = 0.25
CLIPPED = 0.1
GPUS = {"rollout": 2.0, "reward": 1.0, "actor": 1.0}

# (role, rank dp, step start us, step end us, spans [(name, start us, end us, depth)])
_RANKS: list[tuple[str, int, int, int, list[tuple[str, int, int, int]]]] = [
    ("rollout", 0, 0, 1_000_003, [("generate", 7, 400_123, 0),
                                  ("weight_sync", 900_011, 950_017, 0)]),
    ("rollout", 1, 0, 1_000_003, [("generate", 7, 300_101, 0),
                                  ("weight_sync", 900_011, 950_017, 0)]),
    ("reward", 0, 0, 1_000_003, [("reward", 400_200, 480_333, 0),
                                 ("my_thing", 480_333, 490_001, 0)]),
    ("actor", 0, 0, 1_000_003, [("step", 0, 1_000_003, 0), ("train", 500_003, 900_011, 1),
                                ("checkpoint", 850_001, 880_019, 2)]),
    ("actor", 1, 0, 1_000_003, [("train", 500_003, 900_011, 0)]),
    ("actor", 2, 0, 1_000_003, [("train", 500_003, 900_011, 0)]),
    ("actor", 3, 0, 1_000_003, [("train", 500_003, 950_029, 0)]),  # the straggler
]


def _ns(us: int, shift: int) -> int:
    return BASE_NS + (us + shift) * 1_000


def step_roles(shift_us: int = 0) -> tuple[RoleTimelines, ...]:
    out: dict[str, list[RankTimeline]] = {}
    for role, dp, start, end, spans in _RANKS:
        tl = Timeline(_ns(start, shift_us), _ns(end, shift_us), tuple(
            Span(name, _ns(s, shift_us), _ns(e, shift_us), depth) for name, s, e, depth in spans))
        out.setdefault(role, []).append(RankTimeline(Rank(dp=dp), tl))
    return tuple(RoleTimelines(role, tuple(tls), GPUS[role]) for role, tls in out.items())


def step_input(step: int = 5, discarded: str = "") -> StepInput:
    shift = (step - 5) * 1_000_003
    return StepInput("synthetic", 0, step, step_roles(shift), FRAC_ZERO_STD, CLIPPED, discarded)


def reference(data: StepInput, spans: SpanMap | None = None,
              ) -> dict[tuple[str, Bucket, str], float]:
    """GPU-seconds by (role, bucket, reason), painted microsecond by microsecond."""
    spans = spans or SpanMap()
    codes = list(Activity)
    lo = min(t.timeline.start_ns for r in data.roles for t in r.timelines)
    hi = max(t.timeline.end_ns for r in data.roles for t in r.timelines)
    n = (hi - lo) // 1_000

    def us(ns: int) -> int:
        assert (ns - lo) % 1_000 == 0
        return (ns - lo) // 1_000

    painted: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
    for rt in data.roles:
        for t in rt.timelines:
            label = np.full(n, -1)
            inside = np.zeros(n, dtype=bool)
            inside[us(t.timeline.start_ns):us(t.timeline.end_ns)] = True
            for span in sorted(t.timeline.spans, key=lambda s: (s.depth, s.start_ns)):
                activity = spans.activity(span.name)
                if activity is not Activity.STEP:
                    label[us(span.start_ns):us(span.end_ns)] = codes.index(activity)
            label[~inside] = -2
            painted.setdefault(rt.role, []).append((label, inside))

    def busy(roles: Sequence[str], activities: Sequence[Activity] | None = None) -> np.ndarray:
        out = np.zeros(n, dtype=bool)
        for role in roles:
            for label, _ in painted[role]:
                if activities is None:
                    out |= label >= 0
                else:
                    out |= np.isin(label, [codes.index(a) for a in activities])
        return out

    result: dict[tuple[str, Bucket, str], float] = {}
    for rt in data.roles:
        role, g = rt.role, rt.gpus_per_rank * 1e-6
        others = [r for r in painted if r != role]
        generates = any((label == codes.index(Activity.GENERATE)).any()
                        for label, _ in painted[role])
        same = busy([role])
        first = (busy(others, [Activity.TRAIN, Activity.WEIGHT_SYNC]) if generates
                 else busy(others, [Activity.GENERATE]))
        any_other = busy(others)
        counts: dict[tuple[Bucket, str], int] = {}
        for label, _inside in painted[role]:
            for i, activity in enumerate(codes):
                k = int((label == i).sum())
                if k:
                    bucket = spans.unmapped if activity is Activity.OTHER else (
                        ACTIVITY_BUCKET[activity])
                    assert bucket is not None
                    counts[(bucket, activity.value)] = counts.get((bucket, activity.value), 0) + k
            gap = label == -1
            for why, mask in (("straggler", gap & same),
                              ("weights" if generates else "rollouts", gap & ~same & first),
                              ("pipeline", gap & ~same & ~first & any_other),
                              ("unattributed", gap & ~same & ~first & ~any_other)):
                k = int(mask.sum())
                if k:
                    counts[(Bucket.IDLE, why)] = counts.get((Bucket.IDLE, why), 0) + k
        for (bucket, why), k in counts.items():
            if data.discarded and bucket in (Bucket.PRODUCTIVE, Bucket.OVERHEAD):
                key = (role, Bucket.WASTED, "discarded")
                result[key] = result.get(key, 0.0) + k * g
            else:
                result[(role, bucket, why)] = k * g
        gen = result.get((role, Bucket.PRODUCTIVE, "generate"))
        if gen is not None:
            f0, fc = data.frac_reward_zero_std or 0.0, data.clipped_ratio or 0.0
            result[(role, Bucket.WASTED, "no_reward_spread")] = gen * f0
            result[(role, Bucket.WASTED, "truncated")] = gen * (1 - f0) * fc
            result[(role, Bucket.PRODUCTIVE, "generate")] = gen * (1 - f0) * (1 - fc)
    return result
