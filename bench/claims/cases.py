"""Case grids: each seed draws one point of the grid (step times, noise levels, run lengths,
fault magnitudes from 2x to 10^6x), so a seed set covers the grid and a held-out set draws other
points of it."""

from __future__ import annotations

import random
from dataclasses import replace

from bench.claims.runs import RunSpec

__all__ = ["MAGNITUDES", "fault_spec"]

MAGNITUDES = (2.0, 5.0, 10.0, 100.0, 1e3, 1e6)
STEP_SECONDS = (2.0, 20.0, 120.0)
NOISES = (0.02, 0.05, 0.15)
LENGTHS = (80, 150, 400)


def fault_spec(seed: int, faults: tuple[str, ...], metrics: tuple[str, ...],
               magnitudes: tuple[float, ...] = MAGNITUDES, fast: bool = False) -> RunSpec:
    """A faulty run's spec drawn from ``seed`` (its config is the seed: a healthy twin is the
    same spec with another seed and no fault)."""
    rng = random.Random(seed)
    steps = 80 if fast else rng.choice(LENGTHS)
    fault = rng.choice(faults)
    spec = RunSpec(config=seed, seed=2 * seed + 1, steps=steps,
                   step_seconds=rng.choice(STEP_SECONDS), noise=rng.choice(NOISES),
                   fault=fault, metric=rng.choice(metrics), magnitude=rng.choice(magnitudes),
                   onset=int(steps * rng.uniform(0.35, 0.6)), ramp=rng.randint(8, 30),
                   shape=rng.choice(("geometric", "linear")))
    return replace(spec, metric="grad_norm") if fault == "nan" else spec
