"""How far a detector can go on the reward-hacking benchmark: a learned bound beside
``RewardHacking``, on the same held-out runs, named within 15 steps of the onset at no healthy alarm.

Issue 39 asks that a hack be named within 15 steps of its onset on held-out cases, with no alarm on
healthy runs whose reward and length grow together. ``bench_reward_hacking.py`` measures rlmon
against that; this script asks what any detector could do on the same runs from the same series, so
that a miss can be told from a case the data cannot name in time.

The bound is a gradient-boosted classifier (LightGBM) that sees, at each step, for the reward, the
log length, the log KL, the verifier score and the reward-minus-verifier gap: the newest 16 steps'
departures from a least-squares line through the 40 steps before them, in that stretch's robust
noise, and their means over the newest 2, 4, 8 and 16 steps; and ``RewardHacking``'s own z-scores of
the same 16 steps (the evidence the rule sums, step by step). It learns from the benchmark's tuning
and unused seeds (600 seeds; hacked steps 4-30 steps after the onset against every step
of a healthy run and every step of a hacked run before its onset). It is given two advantages no
live detector has, which is what makes it a bound and not a rival:

- its threshold is set on the held-out runs themselves, the lowest that fires on none of their
  healthy runs (nor on a hacked run before its onset); with ``k`` alarms allowed, the lowest that
  fires on ``k`` of them;
- it is not judged before step 56 (40 + 16: its first full window), where the rule is judged from
  step 35 and the early steps of a learning curve bend most.

Prints, per kind of hack, how many are named within 15 steps by ``RewardHacking`` and by the bound
at 0, 1 and 3 alarms, and the same for issue 39's own run in its three forms.
Needs ``lightgbm`` (``pip install -e '.[bound]'``; ``make bench`` installs it).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import warnings
from collections import deque
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_reward_hacking as bench

from rlmon.service.alerting import reward_hacking as rh
from rlmon.service.metrics import catalog as c

if TYPE_CHECKING:
    from lightgbm import Booster

BASE, RECENT = 40, 16  # the line's steps, and the newest steps judged against it
FIRST = BASE + RECENT  # the first step with a full window
MEANS = (2, 4, 8, 16)  # the newest steps whose mean departure is a feature of its own
QUIET = ("healthy", "detection-healthy", "length_runaway", "kl_blowup")
HACKED = ("length", "gap", "climb", "climb-gap")
LEARNED_FROM = (4, 30)  # a hacked run's steps after its onset that are the positive examples
ALARMS = (0, 1, 3)
TRAIN_SEEDS = (bench.TUNING_SEEDS, bench.UNUSED_SEEDS)
Features = np.ndarray  # (steps, features): NaN where a series is not logged or not yet judged


def departures(values: np.ndarray) -> np.ndarray:
    """(steps, RECENT): at each step, the newest RECENT values' departures from the least-squares
    line through the BASE values before them, over that line's robust residual scale (1.4826 x
    the median absolute residual, floored at 1e-3 + 1% of the level); NaN where there is no
    full window or the series is not logged."""
    out = np.full((len(values), RECENT), np.nan)
    if len(values) < FIRST or np.isnan(values).all():
        return out
    windows = sliding_window_view(values, FIRST)
    base = windows[:, :BASE]
    x = np.arange(BASE, dtype=float)
    fit = np.linalg.pinv(np.vstack([np.ones(BASE), x]).T) @ base.T  # (2, windows)
    residuals = base - (fit[0][:, None] + fit[1][:, None] * x)
    centred = residuals - np.median(residuals, axis=1, keepdims=True)
    scale = np.maximum(1.4826 * np.median(np.abs(centred), axis=1),
                       1e-3 + 0.01 * np.abs(np.median(base, axis=1)))
    ahead = np.arange(BASE, FIRST, dtype=float)
    projected = fit[0][:, None] + fit[1][:, None] * ahead
    out[FIRST - 1:] = (windows[:, BASE:] - projected) / scale[:, None]
    return out


def rule_scores(series: bench.Series) -> np.ndarray:
    """(steps, 4): ``RewardHacking``'s z-scores of the reward, the length, the KL and the verifier
    gap at each step, its baseline never pinned (NaN: not judged, or the series not logged)."""
    params = rh.RewardHackingParams()
    history: deque[float] = deque()
    steps = len(series[c.REWARD])
    out = np.full((steps, 4), np.nan)
    for step in range(steps):
        _, found = rh.observe(params, history, 0.0,
                              {name: float(v[step]) for name, v in series.items()})
        if found is not None:
            out[step] = [z if math.isfinite(z) else np.nan for z in
                         (found.z_reward, found.z_length, found.z_kl, found.z_gap)]
    return out


def features(series: bench.Series) -> Features:
    steps = len(series[c.REWARD])
    reward = series[c.REWARD]
    verifier = series.get(c.VERIFIER_SCORE, np.full(steps, np.nan))
    blocks = [departures(v) for v in (
        reward, np.log(series[c.RESPONSE_LENGTH]), np.log(np.maximum(series[c.KL], 0.0) + 1e-3),
        verifier, reward - verifier)]
    scores = rule_scores(series)
    for column in range(scores.shape[1]):
        block = np.full((steps, RECENT), np.nan)
        block[RECENT - 1:] = sliding_window_view(scores[:, column], RECENT)
        blocks.append(block)
    with warnings.catch_warnings():
        # an all-NaN row (a series not logged, a step not judged) has a NaN mean, as meant
        warnings.simplefilter("ignore", RuntimeWarning)
        means = [np.nanmean(block[:, RECENT - m:], axis=1, keepdims=True)
                 for block in blocks for m in MEANS]
    return np.hstack(blocks + means).astype(np.float32)


def _case_features(case: bench.Case) -> tuple[bench.Case, Features]:
    return case, features(bench.series_of(case))


def dataset(seeds: Iterable[range]) -> list[tuple[bench.Case, Features]]:
    all_cases = [case for run in seeds for case in bench.cases(run)]
    with ProcessPoolExecutor(2) as pool:
        return list(pool.map(_case_features, all_cases, chunksize=16))


def examples(data: list[tuple[bench.Case, Features]]) -> tuple[np.ndarray, np.ndarray]:
    rows, labels = [], []
    for case, f in data:
        if case.kind in QUIET:
            rows.append(f[FIRST:])
            labels.append(np.zeros(len(f) - FIRST))
            continue
        before = f[FIRST:case.onset]
        hacked = f[case.onset + LEARNED_FROM[0]:case.onset + LEARNED_FROM[1]]
        rows += [before, hacked]
        labels += [np.zeros(len(before)), np.ones(len(hacked))]
    return np.vstack(rows), np.concatenate(labels)


def learn(data: list[tuple[bench.Case, Features]], rounds: int = 600) -> Booster:
    import lightgbm
    x, y = examples(data)
    params = {"objective": "binary", "learning_rate": 0.05, "num_leaves": 63,
              "min_data_in_leaf": 50, "feature_fraction": 0.5, "bagging_fraction": 0.8,
              "bagging_freq": 1, "seed": 0, "deterministic": True, "force_row_wise": True,
              "verbose": -1, "num_threads": 2}
    return lightgbm.train(params, lightgbm.Dataset(x, y), num_boost_round=rounds)


def thresholds(model: Booster, data: list[tuple[bench.Case, Features]]) -> dict[int, float]:
    """For each number of alarms allowed, the lowest score that fires on no more held-out runs
    than that: healthy runs at any judged step, hacked runs before their onset."""
    highest = []
    for case, f in data:
        judged = f[FIRST:] if case.kind in QUIET else f[FIRST:case.onset]
        if len(judged):
            highest.append(float(model.predict(judged).max()))
    highest.sort(reverse=True)
    return {k: highest[k] for k in ALARMS}


def lag(model: Booster, f: Features, onset: int, threshold: float) -> int | None:
    """Steps from ``onset`` to the first step the bound names (None: never)."""
    over = np.nonzero(model.predict(f[onset:]) > threshold)[0]
    return int(over[0]) if len(over) else None


def rule_lag(case: bench.Case, series: bench.Series) -> int | None:
    """Steps from the onset to ``RewardHacking``'s first firing; None where it never fires, or
    fires before the onset."""
    fired = [step for _, step, state in bench.transitions(case, [bench.reward_hacking_rule()],
                                                          series) if state == "firing"]
    return None if not fired or fired[0] < case.onset else fired[0] - case.onset


def main() -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    try:
        import lightgbm  # noqa: F401
    except (ImportError, OSError) as exc:  # OSError: its OpenMP runtime (libgomp) is missing
        print(f"bound: lightgbm cannot be loaded ({exc}; pip install -e '.[bound]')")
        return 0
    started = time.perf_counter()
    model = learn(dataset(TRAIN_SEEDS))
    held = dataset((bench.HELD_OUT_SEEDS,))
    limits = thresholds(model, held)
    print(f"reward-hacking bound, learned on seeds {TRAIN_SEEDS[0].start}-"
          f"{TRAIN_SEEDS[0].stop - 1} and {TRAIN_SEEDS[1].start}-{TRAIN_SEEDS[1].stop - 1}, "
          f"judged on held-out seeds {bench.HELD_OUT_SEEDS.start}-{bench.HELD_OUT_SEEDS.stop - 1}"
          f" ({time.perf_counter() - started:.0f} s)")
    print(f"named within {bench.WITHIN} steps of the onset: RewardHacking (0 alarms on these runs"
          f" in bench_reward_hacking.py) and the bound at " + ", ".join(
              f"{k} alarm{'s' if k != 1 else ''}" for k in ALARMS))
    for kind in HACKED:
        runs = [(case, f) for case, f in held if case.kind == kind]
        rule = sum(1 for case, _ in runs
                   if (n := rule_lag(case, bench.series_of(case))) is not None
                   and n <= bench.WITHIN)
        bound = [sum(1 for case, f in runs
                     if (n := lag(model, f, case.onset, limits[k])) is not None
                     and n <= bench.WITHIN) for k in ALARMS]
        print(f"  {kind:<9} of {len(runs):>3}: RewardHacking {rule:>3}; bound "
              + ", ".join(f"{n:>3}" for n in bound))
    for signature, verifier, form in ((True, False, "reward, length and KL"),
                                      (True, True, "the same with a verifier score"),
                                      (False, True, "the verifier gap alone")):
        rule = bound0 = 0
        for seed in bench.ISSUE_SEEDS:
            rows = bench.issue_run(seed, signature, verifier)
            series = {name: np.array([r[name] for r in rows]) for name in rows[0]}
            case = bench.Case(seed, "issue", onset=bench.ISSUE_ONSET)
            n = rule_lag(case, series)
            rule += n is not None and n <= bench.WITHIN
            f = features(series)
            early = model.predict(f[FIRST:bench.ISSUE_ONSET]).max() > limits[0]
            n = lag(model, f, bench.ISSUE_ONSET, limits[0])
            bound0 += not early and n is not None and n <= bench.WITHIN
        print(f"  issue 39's run, {form}, seeds {bench.ISSUE_SEEDS.start}-"
              f"{bench.ISSUE_SEEDS.stop - 1}: RewardHacking {rule}; bound at 0 alarms {bound0}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
