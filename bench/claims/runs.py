"""Runs with known truth: TRL's logged keys per step, a config fixing levels and trends, a seed
drawing the sampling noise and a slow wander (two seeds of one config are two equal runs), and
at most one fault from a known step, of a known size.

Faults (``RunSpec.fault``), each moving ``RunSpec.metric`` (a TRL key) from ``onset`` on:

- ``jump``: the metric times ``magnitude`` (entropy: divided by it), held to the end;
- ``blowup``: the metric grows (entropy: decays) until it has moved by ``magnitude``, over
  ``ramp`` steps, then levels off there: geometrically (``shape``), or in a straight line;
- ``nan``: grad norm and loss are NaN.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from rlmon.service.contract.step_record import StepRecord
from rlmon.service.metrics import catalog as c

__all__ = ["CANONICAL", "GeneratedRun", "RunSpec", "crossing", "generate", "records"]

# TRL's keys (as a trainer state holds them) and the catalog's names they map to
CANONICAL = {"kl": c.KL, "entropy": c.ENTROPY, "grad_norm": c.GRAD_NORM, "reward": c.REWARD,
             "loss": c.LOSS, "completions/mean_length": c.RESPONSE_LENGTH,
             "clip_ratio/region_mean": c.CLIP_RATIO, "reward_std": c.REWARD_STD,
             "learning_rate": c.LR}
DOWN = frozenset({"entropy"})  # a fault moves these down


@dataclass(frozen=True, slots=True)
class RunSpec:
    """A generated run: ``config`` fixes its levels and trends, ``seed`` its noise."""

    config: int
    seed: int
    steps: int = 150
    step_seconds: float = 20.0
    noise: float = 0.05  # each metric's step-to-step noise, relative (log-sd)
    fault: str = ""  # "" | jump | blowup | nan
    metric: str = "kl"
    magnitude: float = 10.0  # the factor the fault moves the metric by
    onset: int = 0
    ramp: int = 20  # steps a blow-up takes to reach its magnitude
    shape: str = "geometric"  # a blow-up's course: geometric | linear
    telemetry: bool = False  # log host telemetry (the machine's: differs per seed)

    def healthy(self) -> RunSpec:
        return replace(self, fault="")


@dataclass(frozen=True, slots=True)
class GeneratedRun:
    spec: RunSpec
    rows: dict[int, dict[str, float]]  # step (1..steps) -> TRL key -> value
    name: str = ""
    clean: dict[int, dict[str, float]] = field(default_factory=dict)  # the same without noise


def _ar1(rng: np.random.Generator, n: int, phi: float) -> np.ndarray:
    out = np.empty(n)
    prev = rng.standard_normal()
    scale = math.sqrt(1 - phi * phi)
    for i in range(n):
        prev = phi * prev + scale * rng.standard_normal()
        out[i] = prev
    return out


def _fault_factor(spec: RunSpec, t: np.ndarray) -> np.ndarray:
    since = t - spec.onset
    if spec.fault == "jump":
        factor = np.where(since >= 0, spec.magnitude, 1.0)
    elif spec.fault == "blowup" and spec.shape == "linear":
        factor = 1 + (spec.magnitude - 1) * np.clip((since + 1) / max(spec.ramp, 1), 0, 1)
    elif spec.fault == "blowup":
        rate = math.log(spec.magnitude) / max(spec.ramp, 1)
        factor = np.exp(rate * np.clip(since + 1, 0, spec.ramp))
    else:
        return np.ones_like(t)
    return 1 / factor if spec.metric in DOWN else factor


def generate(spec: RunSpec) -> GeneratedRun:
    cfg = np.random.default_rng(spec.config)
    rng = np.random.default_rng(100_000 + spec.seed)
    n = spec.steps
    t = np.arange(1, n + 1, dtype=float)

    def noisy(values: np.ndarray, relative: float) -> np.ndarray:
        wander = 0.3 * _ar1(rng, n, float(cfg.uniform(0.9, 0.97)))
        return values * np.exp(relative * (rng.standard_normal(n) + wander))

    clean = {
        "reward": cfg.uniform(0.2, 0.4) + cfg.uniform(0.1, 0.3) * (1 - np.exp(-t / 80)),
        "kl": 0.005 + cfg.uniform(0.01, 0.05) * (1 - np.exp(-t / cfg.uniform(40, 150))),
        "entropy": cfg.uniform(0.3, 0.8) * (1 - cfg.uniform(0.1, 0.3) * t / n),
        "grad_norm": cfg.uniform(0.3, 1.5) * np.ones(n),
        "completions/mean_length": cfg.uniform(150, 500) * (1 + cfg.uniform(0, 0.3) * t / n),
        "clip_ratio/region_mean": cfg.uniform(0.01, 0.05) * np.ones(n),
        "reward_std": cfg.uniform(0.2, 0.4) * np.ones(n),
    }
    if spec.fault in ("jump", "blowup"):
        clean[spec.metric] = clean[spec.metric] * _fault_factor(spec, t)
    values = {key: noisy(v, spec.noise) for key, v in clean.items()}
    values["loss"] = spec.noise * 0.2 * rng.standard_normal(n)
    values["learning_rate"] = 1e-6 * np.minimum(1.0, t / 10)
    values["step_time"] = spec.step_seconds * np.exp(0.05 * rng.standard_normal(n))
    if spec.telemetry:  # the machine's: another host, other numbers
        values["perf/host_cpu_cores"] = np.full(n, float(rng.integers(2, 16)))
        values["perf/host_rss_bytes"] = float(rng.uniform(1e9, 8e9)) * (1 + 0.001 * t)
    if spec.fault == "nan":
        broken = t >= spec.onset
        values["grad_norm"] = np.where(broken, np.nan, values["grad_norm"])
        values["loss"] = np.where(broken, np.nan, values["loss"])
    rows = {int(s): {k: float(v[i]) for k, v in values.items()} for i, s in enumerate(t)}
    clean_rows = {int(s): {k: float(v[i]) for k, v in clean.items()} for i, s in enumerate(t)}
    name = f"c{spec.config}-s{spec.seed}" + (f"-{spec.fault}-{spec.metric}-x{spec.magnitude:g}"
                                            f"@{spec.onset}" if spec.fault else "")
    return GeneratedRun(spec, rows, name, clean_rows)


def crossing(run: GeneratedRun, key: str, level: float, down: bool, after: int) -> int | None:
    """The first step after ``after`` whose logged value is at or beyond ``level``."""
    for step in sorted(run.rows):
        value = run.rows[step].get(key, math.nan)
        if step > after and math.isfinite(value) and (value <= level if down else value >= level):
            return step
    return None


def records(run: GeneratedRun, until: int | None = None) -> list[StepRecord]:
    """The run's steps as the service's records (the catalog's names), up to ``until``."""
    return [StepRecord(run=run.name, role="actor", step=step, complete=True, ranks_expected=1,
                       ranks_reporting=1, missing_ranks=(),
                       metrics={CANONICAL[k]: v for k, v in values.items() if k in CANONICAL})
            for step, values in sorted(run.rows.items()) if until is None or step <= until]
