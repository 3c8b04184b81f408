"""Where a metric is heading: the steps until it reaches a known floor or ceiling, with a range
that holds.

An early warning says a metric has left its baseline; the next question is how long the run has.
The levels that matter are the ones the fixed rules page at (entropy's collapse level, the KL
limit, the gradient norm's, the share of groups with no reward spread) and the physical ones (a
clipped-completion ratio of 1: every answer cut; the importance ratio's band).

- **The stretch fitted** is the one since the series last changed course: a line with one bend
  (a hinge) is fitted through the recent values at every possible bend, and the values after
  the best bend are kept (all of them where none fits better). At alert time that is the
  departure, not the baseline it left; at the end of a run whose metric rose and then levelled
  off it is the level stretch, which heads nowhere.
- **The forecast** is a robust line through that stretch (Theil-Sen: the median of the pairwise
  slopes, so one outlier moves nothing; in log space for a positive metric that decays
  geometrically, as entropy does), followed to the level.
- **The range** is calibrated on the forecaster's own past errors (split conformal): the same
  forecast made from each earlier point of the stretch is compared with the values that came
  after it, each error in units of what the forecast's noise and slope uncertainty allow at
  its horizon (``sigma + h tau``); the 90 % quantile of those errors, with the finite-sample
  correction, scales the band ``line +- q (sigma + h tau)``. Its earliest and latest crossing
  of the level are the range.
- **Silence** where the claim cannot be made: the slope's 95 % interval (Sen 1968) includes zero
  or points away from the level (a flat or receding series: at 90 %, one in twenty flat
  stretches shows a trend either way, and a gradient norm levelled off for 35 steps was
  projected to reach its level "in about 57 steps (90% range 0-594)"), the level is already
  reached, fewer than ``MIN_ORIGINS`` earlier forecasts exist to calibrate on, the band's far
  edge never reaches the level, or the level lies further out than a few times the fitted
  stretch. The range itself stays the 90 % one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from statistics import median
from typing import Any, Literal

import numpy as np

from rlmon.service.alerting.rules import Condition, Rule
from rlmon.service.metrics import catalog

__all__ = ["Projection", "Target", "alert_detail", "alert_projection", "project", "project_metric",
           "targets"]

MIN_POINTS = 8
WINDOW = 50  # recent values looked at
MIN_ORIGINS = 4  # earlier forecasts the range is calibrated on, at least
_FIRST_ORIGIN = 4  # values an earlier forecast is made from, at least
_COVERAGE = 0.90
_Z = 1.645  # 90 % two-sided: the slope's interval
_Z_TREND = 1.96  # 95 % two-sided: the interval that must exclude no trend (see Silence)
_MAD_TO_SD = 1.4826
_HORIZON = 4  # no projection beyond this many times the fitted stretch's span


@dataclass(frozen=True, slots=True)
class Target:
    """A level a metric must not reach: ``down`` a floor (reached at or below), ``up`` a
    ceiling."""

    metric: str
    level: float
    direction: Literal["down", "up"]
    what: str  # "EntropyCollapse's level", "1 (every completion cut)"
    log: bool = False  # fit log(value): a positive metric decaying or growing geometrically


@dataclass(frozen=True, slots=True)
class Projection:
    """The steps from the last fitted value until ``target`` is reached: about ``steps``, with
    a 90 % range ``earliest``-``latest``."""

    target: Target
    steps: float
    earliest: float
    latest: float
    last_step: int
    fitted: int  # values in the fit
    calibrated: int = 0  # earlier forecasts whose errors set the range

    @property
    def at_step(self) -> int:
        return self.last_step + round(self.steps)

    def describe(self, seconds_per_step: float | None = None) -> str:
        t = self.target
        text = (f"{t.metric} reaches {t.what} ({t.level:g}) in about {_count(self.steps)} "
                f"steps (90% range {self.earliest:.0f}-{self.latest:.0f} steps: where "
                f"this forecast's own errors on the last {self.fitted} values put it)")
        if seconds_per_step:
            text += (f", about {_hours(self.steps * seconds_per_step)} "
                     f"({_hours(self.earliest * seconds_per_step)}-"
                     f"{_hours(self.latest * seconds_per_step)})")
        return text

    def to_json(self, seconds_per_step: float | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {
            "metric": self.target.metric, "level": self.target.level,
            "direction": self.target.direction, "what": self.target.what,
            "steps": round(self.steps, 1), "earliest": round(self.earliest, 1),
            "latest": round(self.latest, 1), "at_step": self.at_step, "fitted": self.fitted,
            "calibrated": self.calibrated, "range": "90% conformal, from this forecast's own "
                                                   "past errors"}
        if seconds_per_step:
            out["hours"] = round(self.steps * seconds_per_step / 3600, 3)
            out["hours_range"] = [round(self.earliest * seconds_per_step / 3600, 3),
                                  round(self.latest * seconds_per_step / 3600, 3)]
        return out


def _count(steps: float) -> str:
    return f"{steps:.0f}" if steps >= 10 else f"{steps:.1f}"


def _hours(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.0f} min" if seconds >= 60 else f"{seconds:.2g} s"


# physical bounds the rules do not name (the brief's "clipped ratio to 1")
_PHYSICAL = (Target(catalog.CLIPPED_RATIO, 1.0, "up", "1 (every completion cut at the limit)"),)
# positive metrics that move geometrically (a collapse, a blow-up): fitted in logs too
_LOG_METRICS = frozenset({catalog.ENTROPY, catalog.KL, catalog.GRAD_NORM})


def targets(rules: Iterable[Rule]) -> dict[str, list[Target]]:
    """Per metric, the levels its fixed rules page at (a threshold's side, an outside band's two
    edges) and its physical bounds."""
    out: dict[str, list[Target]] = {}
    for rule in rules:
        metric = rule.metric
        if rule.condition is Condition.THRESHOLD and rule.threshold is not None:
            if rule.op in ("<", "<="):
                found = [Target(metric, rule.threshold, "down", f"{rule.name}'s level",
                                metric in _LOG_METRICS and rule.threshold > 0)]
            elif rule.op in (">", ">="):
                found = [Target(metric, rule.threshold, "up", f"{rule.name}'s level",
                                metric in _LOG_METRICS and rule.threshold > 0)]
            else:
                continue
        elif rule.condition is Condition.OUTSIDE and rule.low is not None \
                and rule.high is not None:
            found = [Target(metric, rule.low, "down", f"{rule.name}'s low edge"),
                     Target(metric, rule.high, "up", f"{rule.name}'s high edge")]
        else:
            continue
        out.setdefault(metric, []).extend(found)
    for target in _PHYSICAL:
        out.setdefault(target.metric, []).append(target)
    return out


def _theil_sen(points: Sequence[tuple[float, float]]) -> tuple[float, float, list[float]]:
    """(slope, intercept, the pairwise slopes sorted: what :func:`_interval` reads) of a robust
    line."""
    slopes = sorted((yj - yi) / (xj - xi) for i, (xi, yi) in enumerate(points)
                    for xj, yj in points[i + 1:] if xj != xi)
    if not slopes:
        return 0.0, points[-1][1], slopes
    slope = median(slopes)
    return slope, median(y - slope * x for x, y in points), slopes


def _interval(slopes: list[float], n: int, z: float) -> tuple[float, float]:
    """The slope's interval (low, high), two-sided at ``z`` (Sen 1968), from the sorted pairwise
    slopes of ``n`` points."""
    if not slopes:
        return 0.0, 0.0
    pairs = len(slopes)
    spread = z * math.sqrt(n * (n - 1) * (2 * n + 5) / 18)
    return (slopes[max(0, math.floor((pairs - spread) / 2))],
            slopes[min(pairs - 1, math.ceil((pairs + spread) / 2))])


def _bend(points: Sequence[tuple[float, float]]) -> int:
    """Where the stretch since the series last changed course begins: the bend of the best
    one-bend line (least squares; 0 where a straight line fits as well)."""
    x = np.array([p[0] for p in points], dtype=float)
    y = np.array([p[1] for p in points], dtype=float)
    n = len(points)
    straight = np.linalg.lstsq(np.column_stack([np.ones(n), x]), y, rcond=None)[1]
    best, best_cost = 0, float(straight[0]) if len(straight) else 0.0
    for k in range(MIN_POINTS // 2, n - MIN_POINTS + 1):
        design = np.column_stack([np.ones(n), np.minimum(x - x[k], 0), np.maximum(x - x[k], 0)])
        residual = y - design @ np.linalg.lstsq(design, y, rcond=None)[0]
        cost = float(residual @ residual)
        # the bend must earn its parameter (BIC's log n per parameter, in the residuals' units)
        if cost * (1 + math.log(n) / n) < best_cost:
            best, best_cost = k, cost
    return best


def project(xs: Sequence[float], ys: Sequence[float], target: Target,
            last_step: int | None = None) -> Projection | None:
    """The projection of the points (step, value) to ``target``, or None (too few points, no
    trend towards it, already there, too far out, too few earlier forecasts to calibrate its
    range on, or a range with no far end). A ``log`` target is fitted as a geometric course."""
    points = [(float(x), y) for x, y in zip(xs, ys, strict=True) if math.isfinite(y)]
    if not target.log:
        return _project(points, target, last_step, in_logs=False)
    if target.level <= 0:
        return None
    return _project([(x, math.log(y)) for x, y in points if y > 0], target, last_step,
                    in_logs=True)


def _project(points: Sequence[tuple[float, float]], target: Target, last_step: int | None,
             in_logs: bool) -> Projection | None:
    if len(points) < MIN_POINTS:
        return None
    points = points[_bend(points):]
    n = len(points)
    level = math.log(target.level) if in_logs else target.level
    slope, intercept, slopes = _theil_sen(points)
    toward = -1.0 if target.direction == "down" else 1.0
    if not all(edge * toward > 0 for edge in _interval(slopes, n, _Z_TREND)):
        return None  # the interval includes no trend, or a trend away from the level
    low, high = _interval(slopes, n, _Z)
    x_last = points[-1][0]
    gap = (level - (intercept + slope * x_last)) * toward  # > 0: not there yet
    if gap <= 0:
        return None
    pace = slope * toward
    sigma = _MAD_TO_SD * median(abs(y - intercept - slope * x) for x, y in points)
    tau = (high - low) / (2 * _Z)  # the slope's standard error
    q = _conformal(points, toward, sigma, tau)
    if q is None:
        return None
    steps = gap / pace
    earliest = max(0.0, (gap - q * sigma) / (pace + q * tau))
    if pace <= q * tau:
        return None  # the band's far edge never reaches the level
    latest = (gap + q * sigma) / (pace - q * tau)
    span = max(x_last - points[0][0], 1.0)
    if steps > _HORIZON * span:
        return None
    # the level is seen at a step: the range in whole steps, rounded outward
    return Projection(target, steps, math.floor(earliest), math.ceil(latest),
                      int(x_last) if last_step is None else last_step, n, _origins(n))


def _origins(n: int) -> int:
    return max(0, n - _FIRST_ORIGIN)


def _conformal(points: Sequence[tuple[float, float]], toward: float, sigma: float,
               tau: float) -> float | None:
    """The 90 % quantile of the forecaster's own errors: from each earlier point with
    ``_FIRST_ORIGIN`` values before it, the line through those values against every later value,
    the error over ``sigma + h tau`` (h: the horizon); None with fewer than ``MIN_ORIGINS``
    earlier forecasts."""
    if _origins(len(points)) < MIN_ORIGINS:
        return None
    scores = []
    unit = max(sigma, 1e-12)
    for end in range(_FIRST_ORIGIN, len(points)):
        slope, intercept, _ = _theil_sen(points[:end])
        x0 = points[end - 1][0]
        for x, y in points[end:]:
            scores.append(abs(y - intercept - slope * x) / (unit + (x - x0) * tau))
    scores.sort()
    rank = math.ceil((len(scores) + 1) * _COVERAGE)
    if rank > len(scores):
        return None
    return max(scores[rank - 1], _Z)


def project_metric(metric: str, xs: Sequence[float], ys: Sequence[float],
                   rules: Iterable[Rule], last_step: int | None = None) -> list[Projection]:
    """Every level of ``metric`` its recent values (the last ``WINDOW``) head for, nearest
    first."""
    xs, ys = list(xs)[-WINDOW:], list(ys)[-WINDOW:]
    found = [p for t in targets(rules).get(metric, ())
             if (p := project(xs, ys, t, last_step)) is not None]
    return sorted(found, key=lambda p: p.steps)


def alert_projection(metric: str, recent: Sequence[float], rules: Iterable[Rule],
                     ) -> Projection | None:
    """For a live alert: where the metric's latest values (one per evaluated step, oldest
    first) are heading, in steps from the last; None when nowhere known (the stretch fitted is
    the departure the alert saw: see :func:`project`)."""
    values = list(recent)[-WINDOW:]
    found = project_metric(metric, range(len(values)), values, rules, last_step=0)
    return found[0] if found else None


def alert_detail(metric: str, recent: Sequence[float], rules: Iterable[Rule]) -> str:
    """:func:`alert_projection` in words ("" when nowhere known)."""
    found = alert_projection(metric, recent, rules)
    return found.describe() if found is not None else ""
