"""Where a metric is heading: the steps until it reaches a known floor or ceiling, with a range.

An early warning says a metric has left its baseline; the next question is how long the run has.
The levels that matter are the ones the fixed rules page at (entropy's collapse level, the KL
limit, the gradient norm's, the share of groups with no reward spread) and the physical ones (a
clipped-completion ratio of 1: every answer cut; the importance ratio's band). A robust line is
fitted through the metric's recent values (Theil-Sen: the median of the pairwise slopes, so one
outlier moves nothing; in log space for a positive metric that decays geometrically, as entropy
does) and followed to the level. The range combines the slope's confidence interval (Sen 1968,
from the order statistics of the pairwise slopes) with the residuals' spread around the line:
the earliest arrival takes the steepest slope from the most advanced level, the latest the
flattest from the least. No projection is made when the slope's interval includes zero or
points away from the level, when the level is already reached, or when it lies further out than
a few times the fitted window (a line is not a forecast that far).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from statistics import median
from typing import Any, Literal

from rlmon.service.alerting.rules import Condition, Rule
from rlmon.service.metrics import catalog

__all__ = ["Projection", "Target", "alert_detail", "project", "project_metric", "targets"]

MIN_POINTS = 8
WINDOW = 50  # recent values fitted
_Z = 1.645  # 90 % two-sided
_MAD_TO_SD = 1.4826
_HORIZON = 50  # no projection beyond this many times the fitted window's span


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

    @property
    def at_step(self) -> int:
        return self.last_step + round(self.steps)

    def describe(self, seconds_per_step: float | None = None) -> str:
        t = self.target
        text = (f"{t.metric} reaches {t.what} ({t.level:g}) in about {_count(self.steps)} "
                f"steps (90%: {_count(self.earliest)}-{_count(self.latest)}, from "
                f"{self.fitted} recent values)")
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
            "latest": round(self.latest, 1), "at_step": self.at_step, "fitted": self.fitted}
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
_LOG_METRICS = frozenset({catalog.ENTROPY})


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
                found = [Target(metric, rule.threshold, "up", f"{rule.name}'s level")]
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


def project(xs: Sequence[float], ys: Sequence[float], target: Target,
            last_step: int | None = None) -> Projection | None:
    """The projection of the points (step, value) to ``target``, or None (too few points, no
    trend towards it, already there, too far out)."""
    points = [(x, y) for x, y in zip(xs, ys, strict=True) if math.isfinite(y)]
    if target.log:
        if target.level <= 0:
            return None
        points = [(x, math.log(y)) for x, y in points if y > 0]
    n = len(points)
    if n < MIN_POINTS:
        return None
    level = math.log(target.level) if target.log else target.level
    slopes = sorted((yj - yi) / (xj - xi) for i, (xi, yi) in enumerate(points)
                    for xj, yj in points[i + 1:] if xj != xi)
    if not slopes:
        return None
    slope = median(slopes)
    pairs = len(slopes)
    spread = _Z * math.sqrt(n * (n - 1) * (2 * n + 5) / 18)
    low = slopes[max(0, math.floor((pairs - spread) / 2))]
    high = slopes[min(pairs - 1, math.ceil((pairs + spread) / 2))]
    toward = -1.0 if target.direction == "down" else 1.0
    if not (low * toward > 0 and high * toward > 0):
        return None  # the interval includes no trend, or a trend away from the level
    intercept = median(y - slope * x for x, y in points)
    x_last = points[-1][0]
    now = intercept + slope * x_last
    gap = (level - now) * toward  # > 0: not there yet
    if gap <= 0:
        return None
    sigma = _MAD_TO_SD * median(abs(y - intercept - slope * x) for x, y in points)
    steep, flat = (low, high) if toward < 0 else (high, low)
    steps = gap / (slope * toward)
    earliest = max(0.0, (gap - _Z * sigma) / (steep * toward))
    latest = (gap + _Z * sigma) / (flat * toward)
    span = max(x_last - points[0][0], 1.0)
    if steps > _HORIZON * span:
        return None
    return Projection(target, steps, earliest, latest,
                      int(x_last) if last_step is None else last_step, n)


def project_metric(metric: str, xs: Sequence[float], ys: Sequence[float],
                   rules: Iterable[Rule], last_step: int | None = None) -> list[Projection]:
    """Every level of ``metric`` its recent values (the last ``WINDOW``) head for, nearest
    first."""
    xs, ys = list(xs)[-WINDOW:], list(ys)[-WINDOW:]
    found = [p for t in targets(rules).get(metric, ())
             if (p := project(xs, ys, t, last_step)) is not None]
    return sorted(found, key=lambda p: p.steps)


# An early warning fires a few steps into a departure, its window still mostly the baseline it
# departed from: the latest stretch is fitted first, a longer one only where that shows no trend.
ALERT_WINDOWS = (8, 12, 16, 24, 32, 48)


def alert_detail(metric: str, recent: Sequence[float], rules: Iterable[Rule]) -> str:
    """For a live alert: where the metric's latest values (one per evaluated step, oldest
    first) are heading, in steps; empty when nowhere known."""
    values = list(recent)
    for size in ALERT_WINDOWS:
        if size > len(values):
            break
        latest = values[-size:]
        found = project_metric(metric, range(size), latest, rules, last_step=0)
        if found:
            return found[0].describe().replace(" from ", " at the current pace, from ")
    return ""
