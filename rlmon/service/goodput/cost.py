"""What a condition has cost so far: GPU-hours since its onset, and money at a configured price.

One function for every kind of alert: a step rule's cost runs from the start of the first step
whose condition held to the step that fired or resolved it; a time-based (liveness) alert's, such
as a stalled run, from the moment the run stopped making progress to now. Either way it is the
run's GPUs times the wall time, since every GPU of a synchronous run pays for the condition.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["AlertCost", "Price", "alert_cost", "format_duration"]


@dataclass(frozen=True, slots=True)
class Price:
    """A price per GPU-hour (None: no money is shown) and its currency."""

    per_gpu_hour: float | None = None
    currency: str = "USD"


@dataclass(frozen=True, slots=True)
class AlertCost:
    """GPUs held, seconds since onset, GPU-hours and (with a price) money."""

    gpus: float
    seconds: float
    gpu_hours: float
    money: float | None = None
    currency: str = ""

    def describe(self, state: str = "firing") -> str:
        """``firing for 40 min: 128 GPUs, 85.3 GPU-hours (USD 213.25)``; a resolved alert's
        says ``lasted 40 min: ...``."""
        gpus = f"{self.gpus:g} GPU" + ("" if self.gpus == 1 else "s")
        how = "firing for" if state == "firing" else "lasted"
        text = f"{how} {format_duration(self.seconds)}: {gpus}, {self.gpu_hours:.3g} GPU-hours"
        if self.money is not None:
            text += f" ({self.currency} {self.money:,.2f})"
        return text


def format_duration(seconds: float) -> str:
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5_400:
        return f"{seconds / 60:.0f} min"
    if seconds < 172_800:
        return f"{seconds / 3_600:.1f} h"
    return f"{seconds / 86_400:.1f} days"


def alert_cost(onset: float, now: float, gpus: float, price: Price | None = None) -> AlertCost:
    """The cost of a condition that began at ``onset`` (unix seconds) and holds (or ended) at
    ``now``, on a run of ``gpus`` GPUs. A clock that went back counts as no time."""
    seconds = max(now - onset, 0.0)
    gpu_hours = gpus * seconds / 3_600.0
    money = None
    currency = ""
    if price is not None and price.per_gpu_hour is not None:
        money = gpu_hours * price.per_gpu_hour
        currency = price.currency
    return AlertCost(gpus, seconds, gpu_hours, money, currency)
