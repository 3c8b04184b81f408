"""How counts and values read in rlmon's sentences: "1 rank", "6 ranks" (never a hedged plural);
an alert's value as "0.3182", "NaN", "+Inf" in every surface that prints it."""

from __future__ import annotations

import math

__all__ = ["counted", "format_value"]


def counted(n: int, noun: str) -> str:
    """``n`` and ``noun``, the noun with an ``s`` for any count but one."""
    return f"{n} {noun if n == 1 else noun + 's'}"


def format_value(value: float | None) -> str:
    """A metric's value as rlmon prints it: 4 significant digits, NaN and +Inf / -Inf by name,
    "n/a" where there is none."""
    if value is None:
        return "n/a"
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return f"{value:.4g}"
