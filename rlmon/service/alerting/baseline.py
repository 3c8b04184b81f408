"""The baseline detector behind early-warning rules: each step against the run's own recent past.

Fixed thresholds are right for physical limits but late for slow failures: an entropy sliding
from 0.4 towards 0 crosses 0.01 twenty steps after the slide began. This detector learns where a
metric *should* be from its own trailing window and accumulates evidence that it has left:

- **Baseline**: a robust line through the trailing ``window`` values (the slope from the medians
  of the two halves, the level from the median of the detrended values), extrapolated to the new
  step. A healthy slow drift in the watched direction (entropy decreasing within its range, KL
  growing from zero) is followed, not flagged; one outlier moves neither the level nor the slope.
  A slope against the watched direction counts as flat: extrapolating a recovery or a fading
  warm-up bump would make the plateau after it look like a fall (or a rise). A metric that has no
  healthy drift (policy lag, the trainer/rollout mismatch, the gradient norm) sets
  ``follow_drift=False``: its baseline is a level only, so even a fault slower than the window
  cannot become the baseline's slope.
- **Scale**: 1.4826 x the median absolute residual (a standard deviation for Gaussian noise),
  or, where a quarter of the window sits at one bound (a fraction clipped at 0 in a small
  batch: its MAD measures the pile, and the values off it look like a climb), the spread of the
  values off the pile where that is larger (:func:`spread_at_bound`); floored by
  ``relative_floor`` x the baseline and ``floor``, so a near-constant metric does not turn a
  rounding change into an alarm, and by the window's resolution (its smallest gap between
  distinct values), so a metric that moves in steps is judged in its own steps.
- **Evidence**: a one-sided CUSUM (Page 1954) of the robust z-score in the watched direction,
  ``S = max(0, S + z - allowance)``, firing while ``S >= decision``. Each z is clipped to
  ``allowance + decision / spike_steps`` so a spike shorter than ``spike_steps`` (2: a single
  one) can never fire alone (:func:`z_cap`);
  ``S`` is capped at 2 x ``decision`` so a long fault resolves within a few steps of its end.

Nothing accumulates during the first ``warmup`` values. While the rule fires, the step is judged
against the window's own level (its centre), not the line's extrapolation, so a slide that goes on
keeps it firing; and the engine also holds it firing while the value stays away from the level
before the onset (:func:`reference`, :func:`departed`), so a collapse that settles at its new level
is not learnt as the run's new normal: the warning resolves once the metric returns, or hands over
to the fixed rule that judges that level. The state is the
trailing window and ``S``: plain numbers, saved with the rest of the alert state, so a restarted
service and ``rlmon replay`` continue bit for bit.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from itertools import pairwise
from statistics import NormalDist
from typing import Protocol

from rlmon.service.metrics.spec import BaselineParams, BaselineSpec, Direction

__all__ = ["BaselineParams", "BaselineSpec", "Direction", "Prediction", "Predictions", "departed",
           "level", "observe", "predict", "reference", "spread_at_bound", "z_cap"]

_MAD_TO_SD = 1.4826  # MAD of a Gaussian x this = its standard deviation
_OFF_PILE_MIN = 8  # values off a bound's pile needed to measure their spread
_GAUSS = NormalDist()
_SCORE_CAP = 2.0  # of `decision`: bounds the steps a long fault takes to resolve
_TINY = 1e-12

Prediction = tuple[tuple[float, float], tuple[float, float]]


class Predictions(Protocol):
    """Predictions computed ahead for a whole recorded series
    (:class:`rlmon.service.alerting.baseline_batch.SeriesPredictions`): for the next value,
    ((expected, scale) extrapolated, (expected, scale) at the window's level), or None where the
    detector must predict itself."""

    def take(self, window_length: int, value: float) -> Prediction | None: ...


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    mid = n // 2
    return ordered[mid] if n % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])


def _transform(params: BaselineParams, value: float) -> float:
    if params.log_offset is None:
        return value
    return math.log(max(value, 0.0) + params.log_offset)


def predict(params: BaselineParams, history: deque[float] | list[float],
            extrapolate: bool = True) -> tuple[float, float]:
    """The baseline's (expected next value, scale), in the detector's space (log or raw);
    ``extrapolate=False`` expects the window's own level (its centre) instead of the line's
    value at the next step."""
    offset = params.log_offset  # _transform, inlined: this runs for every metric every step
    values = list(history) if offset is None else [
        math.log(max(v, 0.0) + offset) for v in history]
    n = len(values)
    half = n // 2
    # distance between the centres of the two halves is n - half
    slope = 0.0
    if params.follow_drift:
        slope = (_median(values[n - half:]) - _median(values[:half])) / (n - half)
        slope = min(slope, 0.0) if params.direction == "down" else max(slope, 0.0)
    centre = (n - 1) / 2
    detrended = [v - slope * (i - centre) for i, v in enumerate(values)]
    level = _median(detrended)
    mad = _median([abs(d - level) for d in detrended])
    spread = _MAD_TO_SD * mad
    ordered, q = sorted(values), n // 4
    if ordered[q] == ordered[0] or ordered[n - 1 - q] == ordered[-1]:
        # a quarter of the window at one value, its bound (a fraction clipped at 0): the MAD
        # measures the pile there, not how far the values off it move
        spread = max(spread, spread_at_bound(ordered))
    expected = level + slope * (n - centre) if extrapolate else level
    if params.log_offset is None:
        floor = max(params.floor, params.relative_floor * abs(expected))
    else:
        floor = math.log1p(params.relative_floor)
    return expected, max(spread, floor, _resolution(ordered), _TINY)


def spread_at_bound(ordered: list[float]) -> float:
    """The standard deviation of a window piled at its lowest (or highest) value, a bound the
    metric is clipped at: from two order statistics of the values off the pile, which are a
    censored Gaussian's own quantiles there (0: too few values off the pile to say)."""
    n = len(ordered)
    low = bisect.bisect_right(ordered, ordered[0])  # the pile at the minimum
    high = n - bisect.bisect_left(ordered, ordered[-1])  # ... and at the maximum
    off = ordered[low:] if low >= high else ordered[n - high - 1::-1]
    m = len(off)
    if m < _OFF_PILE_MIN:
        return 0.0
    piled = (n - m) / n
    i, j = m // 3, (2 * m) // 3
    lo = _GAUSS.inv_cdf(piled + (1 - piled) * (i + 0.5) / m)
    hi = _GAUSS.inv_cdf(piled + (1 - piled) * (j + 0.5) / m)
    return abs(off[j] - off[i]) / (hi - lo)


def _resolution(ordered: list[float]) -> float:
    """The smallest gap between two distinct values of the window (``ordered``: sorted): a
    metric that moves in steps (a lag in whole steps, a fraction of 8 prompt groups) cannot show
    a change finer than one, and a window mostly at one value has a MAD of 0 that would make a
    single step look enormous."""
    return min((gap for a, b in pairwise(ordered) if (gap := b - a) > 0.0), default=0.0)


def observe(params: BaselineParams, history: deque[float], score: float, value: float,
            ahead: Predictions | None = None) -> float:
    """Judge ``value`` against ``history`` (its trailing window, oldest first), append it, and
    return the new CUSUM score; the condition holds while the score is >= ``decision``.
    ``ahead``: the same predictions computed for a whole recorded series at once, where the
    engine evaluates a batch (:mod:`rlmon.service.alerting.baseline_batch`)."""
    known = ahead.take(len(history), value) if ahead is not None else None
    if len(history) >= params.warmup:
        # while the rule fires, expect the window's own level, not its extrapolation: a slide
        # that goes on must not become the slope the warning resolves against (it resolves
        # once the metric settles)
        extrapolate = score < params.decision
        if known is not None:
            expected, scale = known[0] if extrapolate else known[1]
        else:
            expected, scale = predict(params, history, extrapolate=extrapolate)
        z = (_transform(params, value) - expected) / scale
        if params.direction == "down":
            z = -z
        cap = z_cap(params)
        z = min(max(z, -cap), cap)
        score = min(max(0.0, score + z - params.allowance), _SCORE_CAP * params.decision)
    history.append(value)
    while len(history) > params.window:
        history.popleft()
    return score


def z_cap(params: BaselineParams) -> float:
    """How far out one step counts: ``spike_steps`` consecutive steps at it fire, fewer
    cannot, however far out each is."""
    return params.allowance + params.decision / params.spike_steps


def reference(params: BaselineParams, history: deque[float]) -> tuple[float, float]:
    """The level before an onset, taken when the rule fires: what the window (without the step
    that fired it) expected at this step, and its scale, in the detector's space. The window is
    mostly pre-onset steps when a rule fires, and its medians ignore the few that are not."""
    values = list(history)[:-1] if len(history) > params.warmup else list(history)
    return predict(params, values)


def level(params: BaselineParams, ref: tuple[float, float]) -> float:
    """The pre-onset level ``ref`` (:func:`reference`) in the metric's own units."""
    expected = ref[0]
    return expected if params.log_offset is None else math.exp(expected) - params.log_offset


def departed(params: BaselineParams, ref: tuple[float, float], value: float) -> bool:
    """Whether ``value`` is still away from the pre-onset level ``ref`` in the watched direction
    by more than the CUSUM's allowance: a firing rule holds while it is (a collapse that settles
    at its new level is not the run's new normal)."""
    expected, scale = ref
    z = (_transform(params, value) - expected) / scale
    return (-z if params.direction == "down" else z) > params.allowance
