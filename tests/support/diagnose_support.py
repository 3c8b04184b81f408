"""Training curves with TRL's logged keys, healthy or with one fault injected from a step on,
for the diagnose tests to hand to the real writers (TensorBoard, W&B, transformers, verl)."""

from __future__ import annotations

import math
import random

__all__ = ["FAULT_ALERT", "fired", "trl_curves"]

# the alert each fault must raise, and how many steps after the fault's first step it fires
FAULT_ALERT = {"entropy_collapse": ("EntropyCollapse", 2), "tied_rewards": ("NoLearningSignal", 2),
               "nan": ("NonFiniteMetric", 0)}


def trl_curves(steps: int = 40, fault: str | None = None, at: int = 25,
               seed: int = 0) -> dict[int, dict[str, float]]:
    """Per step 1..steps, TRL GRPOTrainer's on_log keys (unprefixed, as in trainer_state.json)."""
    rng = random.Random(seed)
    rows = {}
    for step in range(1, steps + 1):
        broken = fault is not None and step >= at
        row = {
            "loss": 0.02 * rng.gauss(0, 1),
            "grad_norm": 1.0 + 0.1 * rng.random(),
            "learning_rate": 1e-5 * (1 - step / (steps + 1)),
            "reward": 0.3 + 0.01 * step + 0.02 * rng.gauss(0, 1),
            "reward_std": 0.4 + 0.02 * rng.random(),
            "frac_reward_zero_std": 0.125 * rng.randint(0, 2),
            "entropy": 2.0 - 0.005 * step + 0.01 * rng.gauss(0, 1),
            "kl": 0.01 + 0.001 * step,
            "clip_ratio/region_mean": 0.01 * rng.random(),
            "completions/mean_length": 40 + rng.random(),
            "rewards/accuracy/mean": 0.5,
            "epoch": step / steps,
        }
        if broken and fault == "entropy_collapse":
            row["entropy"] = 0.001 * rng.random()
        elif broken and fault == "tied_rewards":
            row["frac_reward_zero_std"], row["reward_std"] = 1.0, 0.0
        elif fault == "nan" and at - 3 <= step < at:
            row["grad_norm"] = 10.0 ** (step - at + 4)  # blowing up before it overflows
        elif broken and fault == "nan":
            row["loss"] = row["grad_norm"] = math.nan
        rows[step] = row
    return rows


def fired(findings: object) -> dict[str, int]:
    """alert -> the step it first fired (from a Diagnosis' findings)."""
    out: dict[str, int] = {}
    for f in findings:  # type: ignore[attr-defined]
        if f.state == "firing":
            out.setdefault(f.alert, f.step)
    return out
