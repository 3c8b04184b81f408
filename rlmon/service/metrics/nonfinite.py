"""How rlmon names a non-finite number: JSON has no NaN or Infinity (and SQLite keeps a NaN
as NULL), so one travels or is kept as "NaN", "Infinity" or "-Infinity"."""

from __future__ import annotations

import math

__all__ = ["NONFINITE_VALUES", "nonfinite_name", "nonfinite_value"]

NONFINITE_VALUES = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def nonfinite_name(value: float | None) -> str:
    """How the contract writes a non-finite value: "NaN", "Infinity" or "-Infinity"; '' for a
    finite one or none."""
    if value is None or math.isfinite(value):
        return ""
    if value != value:
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"


def nonfinite_value(value: float | None, name: str | None) -> float | None:
    """A value read back from where a non-finite one was kept as null: ``name``
    (:func:`nonfinite_name`'s, or empty) says which it was."""
    return NONFINITE_VALUES[name] if value is None and name else value
