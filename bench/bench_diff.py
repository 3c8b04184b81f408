"""``rlmon diff`` benchmark: two seeds of one config must not be called diverged, and a change
at a known step must be found soon after it.

Two sources of runs:

- **Simulated metrics** (fast, many pairs): a config (its seed) fixes each metric's level,
  trend, noise level and wander; a run's seed draws its heavy-tailed sampling noise (AR(1),
  Student-t) and its slow wander (AR(1), 0.9-0.98), as two seeds of one config differ. Ten
  metrics a run (entropy, KL, gradient norm, clip ratio, loss, reward, reward spread, tied
  groups, response length, learning rate). Changed pairs: run B's learning rate x3 from a known
  step (the KL climbs faster, the entropy falls faster, the clip ratio rises: each by an amount
  drawn per pair), or its reward function changed (the reward drops by 10-25% of its level).
- **The GRPO workload** (``rlmon.workload.grpo``: real GRPO on a toy task in numpy, written as
  rlmon's partial-report files and read back as ``rlmon diff`` reads them): pairs of seeds of
  the default config, and pairs where run B has the ``lr_spike`` fault (20x the learning rate
  for 8 steps) from a known step.

Prints the false-divergence rate (same config, different seeds, called diverged), and for the
changed pairs the share found and the lag from the change to the step reported (0 = at the
change; negative = reported before it), the metric named first, and the time a diff takes.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

from rlmon.service.diagnose.formats import read_paths
from rlmon.service.diff import DiffParams, DiffResult, RunSeries, diff_runs
from rlmon.service.diff.runs import from_logged
from rlmon.service.metrics import catalog as c

STEPS = 300
NOISY = (c.ENTROPY, c.KL, c.GRAD_NORM, c.CLIP_RATIO, c.LOSS, c.REWARD, c.REWARD_STD,
         c.FRAC_REWARD_ZERO_STD, c.RESPONSE_LENGTH)


def _ar1(rng: np.random.Generator, n: int, phi: float, df: float = 5.0) -> np.ndarray:
    shocks = rng.standard_t(df, n) / math.sqrt(df / (df - 2))
    out = np.empty(n)
    prev = rng.standard_normal()
    scale = math.sqrt(1 - phi * phi)
    for i in range(n):
        prev = phi * prev + scale * shocks[i]
        out[i] = prev
    return out


def simulated_run(config: int, seed: int, change: str = "", at: int = 0,
                  steps: int = STEPS) -> RunSeries:
    """A run of ``config`` with ``seed``'s noise; ``change`` (lr | reward) from step ``at``."""
    cfg = np.random.default_rng(config)
    rng = np.random.default_rng(10_000 + seed)
    eff = np.random.default_rng(20_000 + seed)  # the change's size, per pair
    t = np.arange(steps, dtype=float)
    after = t >= at if change else np.zeros(steps, dtype=bool)
    since = np.where(after, t - at, 0.0)

    def noise(lo: float, hi: float) -> np.ndarray:
        sd = float(cfg.uniform(lo, hi))
        wander = cfg.uniform(0.1, 0.7) * _ar1(rng, steps, float(cfg.uniform(0.9, 0.98)), 30)
        return sd * (_ar1(rng, steps, float(cfg.uniform(0, 0.3))) + wander)

    lr = 1e-6 * np.minimum(1, (t + 1) / 20) * (1 - 0.5 * t / steps)
    fast = 0.0  # how strongly this config answers a 3x LR
    if change == "lr":
        lr = np.where(after, 3 * lr, lr)
        fast = float(eff.uniform(0.3, 1.0))
    e0 = cfg.uniform(0.3, 0.6)
    entropy = e0 * (1 - cfg.uniform(0.2, 0.5) * (1 - np.exp(-t / cfg.uniform(100, 400))))
    entropy = entropy * np.exp(-fast * 0.004 * since)
    kl = (0.001 + cfg.uniform(0.05, 0.3) * (1 - np.exp(-t / cfg.uniform(50, 300))))
    kl = kl * np.exp(fast * 0.01 * since)
    clip = cfg.uniform(0.01, 0.08) * (1 + fast * np.minimum(since / 10, 1.0))
    reward = cfg.uniform(0.1, 0.3) + cfg.uniform(0.2, 0.5) * (1 - np.exp(-t / cfg.uniform(30, 200)))
    if change == "reward":
        reward = reward * np.where(after, 1 - eff.uniform(0.1, 0.25), 1.0)
    length = cfg.uniform(150, 600) * (1 + cfg.uniform(0, 0.4) * t / steps)
    s = {
        c.ENTROPY: entropy * np.exp(noise(0.01, 0.06)),
        c.KL: kl * np.exp(noise(0.03, 0.15)),
        c.GRAD_NORM: cfg.uniform(0.05, 0.8) * np.exp(noise(0.05, 0.25)),
        c.CLIP_RATIO: np.clip(clip * np.exp(noise(0.05, 0.2)), 0, 1),
        c.LOSS: cfg.uniform(-0.05, 0.05) + noise(0.01, 0.05),
        c.REWARD: np.clip(reward + noise(0.01, 0.05), 0, 1),
        c.REWARD_STD: cfg.uniform(0.2, 0.4) * np.exp(noise(0.02, 0.08)),
        c.FRAC_REWARD_ZERO_STD: np.clip(cfg.uniform(0.1, 0.4) + noise(0.01, 0.05), 0, 1),
        c.RESPONSE_LENGTH: length * np.exp(noise(0.01, 0.04)),
        c.LR: lr,
    }
    series = {name: {int(i): float(v) for i, v in enumerate(values)} for name, values in s.items()}
    label = f"config{config}-seed{seed}" + (f"-{change}@{at}" if change else "")
    return RunSeries(label, label, "simulated", "simulated", series,
                     config={"learning_rate": 3e-6 if change == "lr" else 1e-6, "seed": seed})


def grpo_run(seed: int, fault_step: int | None, directory: Path, steps: int) -> RunSeries:
    """The GRPO workload's run, written as rlmon's partial reports and read back."""
    from rlmon.workload.grpo import GRPOConfig, simulate

    path = directory / f"grpo-{seed}-{fault_step}.jsonl"
    with path.open("w") as handle:
        for record in simulate(steps=steps, dp=1, cp=1, fault_step=fault_step,
                               run=f"grpo-{seed}", config=GRPOConfig(seed=seed),
                               fault="lr_spike"):
            handle.write(json.dumps(record) + "\n")
    runs, problems = read_paths([path])
    assert runs and not problems, problems
    return from_logged(runs[0], str(path))


def _lag_line(label: str, results: list[tuple[DiffResult, int]]) -> str:
    lags = [r.first.onset - at for r, at in results if r.first is not None and r.first.onset
            is not None]
    named = Counter(r.first.metric for r, _ in results if r.first is not None)
    text = (f"mean {statistics.mean(lags):.1f}, median {statistics.median(lags):.0f}, "
            f"range {min(lags)} to {max(lags)}") if lags else "-"
    return (f"  {label}: found {len(lags)} of {len(results)}; lag {text}; named first: "
            + ", ".join(f"{m} {n}" for m, n in named.most_common(4)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=50, help="simulated pairs of each kind")
    parser.add_argument("--grpo-pairs", type=int, default=10, help="GRPO workload pairs")
    parser.add_argument("--first-seed", type=int, default=5000)
    parser.add_argument("--z", type=float, default=DiffParams().z)
    parser.add_argument("--persist", type=int, default=DiffParams().persist)
    parser.add_argument("--smooth", type=int, default=DiffParams().smooth)
    args = parser.parse_args()
    params = DiffParams(smooth=args.smooth, z=args.z, persist=args.persist)
    print(f"rlmon diff benchmark: parameters {params}")
    seeds = range(args.first_seed, args.first_seed + args.pairs)
    started = time.perf_counter()
    same = [diff_runs(simulated_run(s, 2 * s), simulated_run(s, 2 * s + 1), params)
            for s in seeds]
    elapsed = time.perf_counter() - started
    false = [r for r in same if r.diverged]
    print(f"simulated, {STEPS} steps, 10 metrics a run ({elapsed / len(same) * 1000:.0f} ms a "
          "diff on this machine):")
    print(f"  same config, different seeds: {len(false)} of {len(same)} called diverged "
          f"(false-divergence rate {len(false) / len(same):.1%})"
          + ("; " + ", ".join(f"{r.a.label} {r.first.metric if r.first else ''}@"
                              f"{r.first.onset if r.first else ''}" for r in false[:5])
             if false else ""))
    for change in ("lr", "reward"):
        results = []
        for s in seeds:
            at = int(np.random.default_rng(s).integers(60, 200))
            results.append((diff_runs(simulated_run(s, 2 * s), simulated_run(
                s, 2 * s + 1, change, at), params), at))
        exact = sum(bool(r.exact_differences) for r, _ in results)
        print(_lag_line(f"{'learning rate x3' if change == 'lr' else 'reward changed'} "
                        f"at a step in 60-199", results)
              + (f"; the LR curve itself differs exactly in {exact}" if change == "lr" else ""))
    if args.grpo_pairs:
        grpo_steps, at = 80, 40
        started = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            base = [grpo_run(s, None, folder, grpo_steps) for s in range(2 * args.grpo_pairs)]
            faulty = [grpo_run(2 * i + 1, at, folder, grpo_steps)
                      for i in range(args.grpo_pairs)]
        same_g = [diff_runs(base[2 * i], base[2 * i + 1], params) for i in range(args.grpo_pairs)]
        spiked = [(diff_runs(base[2 * i], faulty[i], params), at)
                  for i in range(args.grpo_pairs)]
        print(f"GRPO workload (rlmon.workload.grpo), {grpo_steps} steps, written and read back "
              f"as rlmon files ({time.perf_counter() - started:.0f} s to simulate):")
        wrong = [r for r in same_g if r.diverged]
        print(f"  same config, different seeds: {len(wrong)} of {len(same_g)} called diverged"
              + ("; " + ", ".join(f"{r.first.metric}@{r.first.onset}" for r in wrong
                                  if r.first) if wrong else ""))
        print(_lag_line(f"lr_spike (20x for 8 steps) from step {at}, other seed", spiked))
    return 0


if __name__ == "__main__":
    sys.exit(main())
