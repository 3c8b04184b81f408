"""What moved first: among an alert's related metrics, the one that left its baseline first.

An alert names the metric that crossed its bound; the cause often shows earlier in another one.
When the trainer/rollout log-prob mismatch rises before the smallest IS ratio falls, the weights
the rollout engine samples with went stale (a weight sync); when the ratio's minimum falls first
with the mean mismatch calm, a few tokens disagree (precision, a kernel). So at each firing the
service looks back over the steps before it, finds where each related metric left its own recent
baseline in the direction that signals trouble, and says which went first and what to look at:
"`actor/logp_diff` rose 4 steps before `actor/is_ratio_min` fell: look at the weight sync first".

A metric left its baseline at a step more than :data:`Z` robust standard deviations (median and
MAD of the :data:`BASELINE` steps before it) beyond it, when the next step and three in four of
the steps up to the firing are beyond it too (it left and stayed out); the search covers
:data:`LOOKBACK` steps up to the firing step. Nothing is
said when fewer than two related metrics moved, or when the first two moved at the same step.

:class:`FirstMovers` keeps the last :data:`KEEP` steps of the tracked metrics per run (all roles
together: the mismatch is the trainer's, the policy lag the rollout's), in memory, bounded.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from rlmon.service.alerting.engine import AlertEvent
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.metrics import catalog as c

__all__ = ["BASELINE", "KEEP", "LOOKBACK", "RELATED", "TRACKED", "FirstMovers", "Mover", "Z",
           "departure", "explain_steps", "first_moved"]

KEEP = 64  # steps kept per run and metric
LOOKBACK = 30  # steps before the firing searched for a departure
BASELINE = 30  # steps a departure is measured against
MIN_BASELINE = 8  # fewer steps than this before a step: no baseline, no departure
Z = 4.0  # robust standard deviations beyond the baseline's median

Direction = Literal["up", "down"]


@dataclass(frozen=True, slots=True)
class Mover:
    """A related metric, the direction that signals trouble, and where to look when it moved
    first."""

    metric: str
    direction: Direction
    look_at: str


def _mismatch() -> tuple[Mover, ...]:
    return (Mover(c.LOGP_DIFF, "up", "look at the weight sync first"),
            Mover(c.IS_RATIO_MIN, "down", "look at a few tokens first (the worst samples: "
                  "precision, a kernel, a tokenizer mismatch)"),
            Mover(c.POLICY_LAG, "up", "look at the rollouts' staleness first"),
            Mover(c.IS_MASKED_FRAC, "up", "look at the rollout engine's sampling first"),
            Mover(c.IS_RATIO, "up", "look at the weight sync first"))


def _entropy() -> tuple[Mover, ...]:
    return (Mover(c.ENTROPY, "down", "look at the sampling temperature and clip bounds first"),
            Mover(c.REWARD, "up", "the reward rose first: look for reward hacking first"),
            Mover(c.KL, "up", "look at the KL penalty first"),
            Mover(c.CLIP_RATIO, "up", "look at the update size (learning rate) first"),
            Mover(c.RESPONSE_LENGTH, "down", "look at the completions (shorter, repeated) first"))


def _kl() -> tuple[Mover, ...]:
    return (Mover(c.KL, "up", "look at the KL penalty first"),
            Mover(c.LR, "up", "look at the learning-rate schedule first"),
            Mover(c.REWARD, "up", "the reward rose first: look for reward hacking first"),
            Mover(c.ENTROPY, "down", "look at the sampling temperature first"),
            Mover(c.CLIP_RATIO, "up", "look at the update size (learning rate) first"))


def _grad() -> tuple[Mover, ...]:
    return (Mover(c.GRAD_NORM, "up", "look at the gradient clipping first"),
            Mover(c.LR, "up", "look at the learning-rate schedule first"),
            Mover(c.LOSS_SCALE, "down", "look at the fp16 loss scale first"),
            Mover(c.CLIP_RATIO, "up", "look at the update size first"),
            Mover(c.LOGP_DIFF, "up", "look at the weight sync first"))


def _clip() -> tuple[Mover, ...]:
    return (Mover(c.CLIP_RATIO, "up", "look at the update size first"),
            Mover(c.LR, "up", "look at the learning-rate schedule first"),
            Mover(c.APPROX_KL, "up", "look at the passes over each batch first"),
            Mover(c.LOGP_DIFF, "up", "look at the weight sync first"),
            Mover(c.ENTROPY, "down", "look at the sampling temperature first"))


def _signal() -> tuple[Mover, ...]:
    return (Mover(c.FRAC_REWARD_ZERO_STD, "up", "look at the prompts' difficulty first"),
            Mover(c.ENTROPY, "down", "entropy fell first: look at the policy's collapse first"),
            Mover(c.REWARD_STD, "down", "look at the reward function's spread first"),
            Mover(c.REWARD, "down", "look at the reward function first"))


def _reward() -> tuple[Mover, ...]:
    return (Mover(c.REWARD, "down", "look at the reward function first"),
            Mover(c.CLIPPED_RATIO, "up", "truncation rose first: look at the length limit first"),
            Mover(c.ENTROPY, "down", "look at the policy's collapse first"),
            Mover(c.FRAC_REWARD_ZERO_STD, "up", "look at the reward function first"),
            Mover(c.LOGP_DIFF, "up", "look at the weight sync first"))


def _length() -> tuple[Mover, ...]:
    return (Mover(c.RESPONSE_LENGTH, "up", "look at the length limit and shaping first"),
            Mover(c.CLIPPED_RATIO, "up", "look at the length limit first"),
            Mover(c.REWARD, "up", "the reward rose first: look for a length-rewarding reward "
                  "first"),
            Mover(c.ENTROPY, "up", "look at the sampling (repetition) first"))


def _hacking() -> tuple[Mover, ...]:
    return (Mover(c.REWARD, "up", "the reward rose first: read its highest-scored completions "
                  "first"),
            Mover(c.RESPONSE_LENGTH, "up", "the length rose first: look for padding or "
                  "repetition first"),
            Mover(c.KL, "up", "look at the KL penalty first"),
            Mover(c.ENTROPY, "down", "look at the completions (repeated phrases) first"))


def _lag() -> tuple[Mover, ...]:
    return (Mover(c.POLICY_LAG, "up", "look at the rollouts' staleness first"),
            Mover(c.GENERATE_SECONDS, "up", "generation slowed first: look at the rollout "
                  "engine first"),
            Mover(c.WEIGHT_SYNC_SECONDS, "up", "look at the weight sync first"),
            Mover(c.LOGP_DIFF, "up", "look at the weight sync first"))


RELATED: Mapping[str, tuple[Mover, ...]] = {
    **dict.fromkeys(("ISRatioDivergence", "ISRatioStale", "LogprobMismatch",
                     "LogprobDivergence", "LogprobMismatchClimbing"), _mismatch()),
    **dict.fromkeys(("EntropyCollapse", "EntropySliding"), _entropy()),
    **dict.fromkeys(("KLDivergence", "KLClimbing"), _kl()),
    **dict.fromkeys(("GradNormHigh", "GradNormBlowingUp"), _grad()),
    **dict.fromkeys(("ClipRatioHigh", "ClipRatioClimbing"), _clip()),
    **dict.fromkeys(("NoLearningSignal", "LearningSignalFading"), _signal()),
    **dict.fromkeys(("RewardStuck", "RewardCollapsing"), _reward()),
    **dict.fromkeys(("CompletionsTruncated", "ResponseLengthRunaway"), _length()),
    "PolicyLagGrowing": _lag(),
    "RewardHacking": _hacking(),
}
TRACKED: frozenset[str] = frozenset(m.metric for ms in RELATED.values() for m in ms)


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    mid = n // 2
    return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _scale(base: Sequence[float], median: float) -> float:
    """A robust spread of ``base``: its MAD as a standard deviation, at least the mean absolute
    deviation (a discrete metric, a policy lag of 1 that is now and then 2, has a MAD of 0) and
    1% of its level (a constant learning rate)."""
    deviations = [abs(v - median) for v in base]
    return max(_median(deviations) * 1.4826, sum(deviations) / len(deviations),
               0.01 * abs(median), 1e-12)


def departure(series: Sequence[tuple[int, float]], direction: Direction, until: int
              ) -> int | None:
    """The step at which ``series`` (step, value; increasing steps) left its baseline in
    ``direction`` and stayed out, searching the LOOKBACK steps up to ``until``; None if it did
    not. Left: more than Z robust standard deviations past the median of the BASELINE steps
    before it; stayed out: so were the next step and at least 3 in 4 of the steps up to
    ``until``, against that same baseline (a one-step outlier is not a departure)."""
    points = [(s, v) for s, v in series if s <= until and math.isfinite(v)]
    sign = 1.0 if direction == "up" else -1.0
    for i in range(MIN_BASELINE, len(points)):
        if points[i][0] < until - LOOKBACK:
            continue
        base = [v for _, v in points[max(0, i - BASELINE):i]]
        median = _median(base)
        scale = _scale(base, median)
        beyond = [sign * (v - median) / scale > Z for _, v in points[i:]]
        if beyond[0] and (len(beyond) == 1 or beyond[1]) and sum(beyond) >= 0.75 * len(beyond):
            return points[i][0]
    return None


def first_moved(alert: str, history: Mapping[str, Sequence[tuple[int, float]]], step: int
                ) -> str:
    """The sentence for ``alert`` firing at ``step``, from each related metric's recent
    (step, value) pairs; "" when there is nothing to say."""
    movers = RELATED.get(alert)
    if not movers:
        return ""
    moved = []
    for order, mover in enumerate(movers):
        at = departure(history.get(mover.metric, ()), mover.direction, step)
        if at is not None:
            moved.append((at, order, mover))
    if len(moved) < 2:
        return ""
    moved.sort(key=lambda m: (m[0], m[1]))
    (first_at, _, first), (second_at, _, second) = moved[0], moved[1]
    if first_at == second_at:
        return ""
    gap = second_at - first_at
    steps = "1 step" if gap == 1 else f"{gap} steps"
    return (f"`{first.metric}` {_verb(first.direction)} {steps} before `{second.metric}` "
            f"{_verb(second.direction)}: {first.look_at}")


def _verb(direction: Direction) -> str:
    return "rose" if direction == "up" else "fell"


class FirstMovers:
    """The recent values of the related metrics, per run (every role), and the sentence for a
    firing. Bounded: :data:`KEEP` steps of the :data:`TRACKED` metrics per run; a run's values
    go with :meth:`forget` (the service calls it when the run leaves memory) or when a newer
    attempt of the run starts."""

    def __init__(self) -> None:
        self._runs: dict[str, tuple[int, dict[str, deque[tuple[int, float]]]]] = {}

    def __len__(self) -> int:
        return len(self._runs)

    def observe(self, record: StepRecord) -> None:
        held = self._runs.get(record.run)
        if held is None or record.attempt > held[0]:
            held = self._runs[record.run] = (record.attempt, {})
        elif record.attempt < held[0]:
            return  # an older attempt's late step
        series = held[1]
        for name, value in record.metrics.items():
            if name not in TRACKED:
                continue
            values = series.get(name)
            if values is None:
                values = series[name] = deque(maxlen=KEEP)
            if values and values[-1][0] >= record.step:
                continue  # one value per step (the first role to report it)
            values.append((record.step, value))

    def explain(self, events: Iterable[AlertEvent]) -> list[AlertEvent]:
        """``events`` with ``first_moved`` set on the firings it can say something about."""
        out = []
        for event in events:
            if event.state == "firing" and not event.first_moved:
                held = self._runs.get(event.run)
                text = first_moved(event.alert, held[1], event.step) if held else ""
                if text:
                    event = replace(event, first_moved=text)
            out.append(event)
        return out

    def forget(self, runs: Iterable[str]) -> None:
        for run in runs:
            self._runs.pop(run, None)


def explain_steps(steps: Sequence[tuple[StepRecord, list[AlertEvent]]]
                  ) -> list[tuple[StepRecord, list[AlertEvent]]]:
    """A replay's steps with what moved first on their firings. Offline, every role's values
    are known before any firing is explained (a replay evaluates one stream after another), so
    each firing sees the related metrics of every role up to its step."""
    series: dict[tuple[str, int], dict[str, list[tuple[int, float]]]] = {}
    for record, _events in steps:
        held = series.setdefault((record.run, record.attempt), {})
        for name, value in record.metrics.items():
            if name in TRACKED:
                held.setdefault(name, []).append((record.step, value))
    for held in series.values():
        for values in held.values():
            values.sort()
    out = []
    for record, events in steps:
        explained = []
        for event in events:
            if event.state == "firing" and not event.first_moved:
                text = first_moved(event.alert, series.get((record.run, record.attempt), {}),
                                   event.step)
                event = replace(event, first_moved=text) if text else event
            explained.append(event)
        out.append((record, explained))
    return out
