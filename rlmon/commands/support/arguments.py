"""Argument types shared by the subcommands."""

from __future__ import annotations

import argparse
import math

__all__ = ["gpu_count", "gpu_price", "positive_number"]

MOST_GPUS = float(1 << 20)  # the most GPUs one run can have, as the settings read (world_size)
MOST_PRICE = 1e6  # per GPU-hour, in any currency


def positive_number(text: str, most: float = math.inf) -> float:
    """A finite number > 0 and at most ``most``, or argparse's usage error."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    if value > most:
        raise argparse.ArgumentTypeError(f"expected at most {most:g}, got {text!r}")
    return value


def gpu_count(text: str) -> float:
    """``--gpus``: a positive number of GPUs, at most ``MOST_GPUS``."""
    return positive_number(text, MOST_GPUS)


def gpu_price(text: str) -> float:
    """``--price-per-gpu-hour``: a positive price, at most ``MOST_PRICE``."""
    return positive_number(text, MOST_PRICE)
