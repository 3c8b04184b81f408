"""Threshold colour bands drawn on a panel, derived from the catalog's alert specs.

Grafana draws thresholds as an ordered list of (start value, colour) steps. Each region between
two alert boundaries gets the colour of the worst alert that fires inside it, so several alerts on
one panel (a warning and a critical level, a lower and an upper bound) compose without special
cases. Every level stays a step even when the colour does not change across it, so Grafana draws
a line at each alert threshold.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from rlmon.service.metrics.spec import AlertSpec, Comparison, Severity

__all__ = ["COLORS", "Band", "alert_bands", "healthy_bands"]

OK = "green"
COLORS: dict[Severity | None, str] = {
    None: OK,
    Severity.WARNING: "orange",
    Severity.CRITICAL: "red",
}
_RANK = {None: 0, Severity.WARNING: 1, Severity.CRITICAL: 2}


@dataclass(frozen=True, slots=True)
class Band:
    """A threshold step: values from ``start`` upward (``None``: from -inf) have ``color``."""

    start: float | None
    color: str


def _fires(alert: AlertSpec, x: float) -> bool:
    t = alert.threshold
    match alert.comparison:
        case Comparison.GT:
            return x > t
        case Comparison.GE:
            return x >= t
        case Comparison.LT:
            return x < t
        case Comparison.LE:
            return x <= t
        case Comparison.OUTSIDE:
            return x < t or x > alert.high
        case _:
            return False


def _boundaries(alert: AlertSpec) -> list[float]:
    if alert.comparison is Comparison.OUTSIDE:
        return [alert.threshold, alert.high]
    return [alert.threshold]


def _probe(points: list[float], index: int) -> float:
    """A value strictly inside region ``index`` (region i starts at points[i-1])."""
    if index == 0:
        return points[0] - 1.0
    if index == len(points):
        return points[-1] + 1.0
    return (points[index - 1] + points[index]) / 2.0


def alert_bands(alerts: Iterable[AlertSpec]) -> list[Band]:
    """Bands for a panel whose series are judged by ``alerts`` (empty when there are none).

    ``abs<`` alerts (a value stuck at zero) are not levels one can see on a chart and are left out.
    """
    alerts = [a for a in alerts if a.comparison is not Comparison.ABS_LT]
    points = sorted({b for a in alerts for b in _boundaries(a)})
    if not points:
        return []
    bands: list[Band] = []
    for i in range(len(points) + 1):
        x = _probe(points, i)
        worst = max(
            (a.severity for a in alerts if _fires(a, x)), key=_RANK.__getitem__, default=None
        )
        bands.append(Band(None if i == 0 else points[i - 1], COLORS[worst]))
    return bands


def healthy_bands(healthy: tuple[float, float]) -> list[Band]:
    """Bands for a metric with a healthy range but no alert: outside the range is a warning hue."""
    low, high = healthy
    warn = COLORS[Severity.WARNING]
    if low <= 0.0:  # a lower bound at zero is the physical floor, not a warning level
        return [Band(None, OK), Band(high, warn)]
    return [Band(None, warn), Band(low, OK), Band(high, warn)]
