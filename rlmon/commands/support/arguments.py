"""Argument types shared by the subcommands."""

from __future__ import annotations

import argparse
import math

__all__ = ["positive_number"]


def positive_number(text: str) -> float:
    """A finite number > 0 (``--gpus``, ``--price-per-gpu-hour``), or argparse's usage error."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value
