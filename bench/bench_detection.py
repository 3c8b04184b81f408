"""Detection benchmark: how soon each rule pack catches a failing run, and how often it cries wolf.

Simulated GRPO runs (issue 16). Healthy runs stay in the healthy ranges of Axolotl's training
stability guide (entropy 0.05-0.5 and slowly falling, KL 0-0.5 and slowly growing, grad norm
0.001-1 with spikes, clip ratio < 0.1, truncated completions < 0.3, frac_reward_zero_std < 0.8, a
reward rising with plateaus, response length drifting up) with per-run levels, trends, noise
levels, autocorrelation (AR(1)), heavy-tailed noise and an LR warm-up bump, all drawn from the
run's seed. Faults of eight kinds set in at a random step, either at once (abrupt), over 15-30 steps
(gradual) or over 60-120 steps (slow), and end at the Axolotl guide's red flags, so both packs
catch them eventually: the question is when.

Both packs run through rlmon's real AlertEngine on StepRecords. The early-warning pack is the
default pack (fixed thresholds + baseline rules); the fixed pack is the same run's events of the
threshold rules alone (rules are independent state machines, so that is exactly what the fixed
pack alone would give). The detector's parameters were tuned on the tuning seeds (0-299); the
figures printed are for held-out seeds (6000-6023) unless ``--seeds tuning``.

Prints, per fault kind and onset, the share of runs caught and the steps from onset to the first
right alert (0 = at the onset step), and false alarms per 1,000 healthy steps. ``--plot PATH``
draws the figure of docs/early-warning.md. ``--sensitivity 0.5,0.75,1`` prints the trade-off instead: every
early-warning rule's decision threshold scaled by each factor, and what it buys in speed and costs in
false alarms.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import os
import statistics
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rlmon.service.alerting.baseline import predict
from rlmon.service.alerting.engine import AlertEngine
from rlmon.service.alerting.rules import (
    Condition,
    Rule,
    default_rules,
    early_warning_rules,
    fixed_rules,
)
from rlmon.service.contract.step_record import StepRecord

Series = dict[str, np.ndarray]

# 300 tuning seeds: about 850,000 healthy steps per rule, enough to see the rare heavy-tailed
# excursion that 100 seeds (the previous tuning set) hid and held-out runs then tripped over
TUNING_SEEDS = range(0, 300)
# 1000-1023 ... 5000-5023 were looked at for earlier versions: no longer held out
HELD_OUT_SEEDS = range(6000, 6024)
HEALTHY_LENGTHS = (100, 300, 1000)  # steps; 300 is the target's length
ONSETS = {"abrupt": (1, 1), "gradual": (15, 30), "slow": (60, 120)}  # ramp length, steps
ACTOR = ("actor/entropy", "actor/kl", "actor/logp_diff", "actor/grad_norm", "actor/clip_ratio",
         "actor/is_ratio", "actor/is_ratio_min")


def _ar1(rng: np.random.Generator, n: int, phi: float, df: float = 5.0) -> np.ndarray:
    """Unit-variance AR(1) noise with Student-t innovations (heavier tails than Gaussian)."""
    shocks = rng.standard_t(df, n) / math.sqrt(df / (df - 2))
    out = np.empty(n)
    prev = rng.standard_normal()
    scale = math.sqrt(1 - phi * phi)
    for i in range(n):
        prev = phi * prev + scale * shocks[i]
        out[i] = prev
    return out


NOISE = frozenset({"sampling", "wander"})


def healthy_run(seed: int, steps: int, noise_parts: frozenset[str] = NOISE
                ) -> tuple[Series, float]:
    """One healthy run's metrics, and its response-length limit. ``noise_parts`` leaves parts of
    the noise out (the random draws are the same, so the rest of the run is too): the
    perfect-baseline bound (``--bound``) compares a run with its own noise-free trajectory."""
    rng = np.random.default_rng(seed)
    t = np.arange(steps, dtype=float)
    drift = np.minimum(t, 300) / 300  # slow healthy drifts level off: in range at any length
    sampled = "sampling" in noise_parts

    def noise(rel_lo: float, rel_hi: float) -> np.ndarray:
        """Sampling noise of a fresh batch (nearly independent from step to step) plus a slow
        wander of the policy itself (strongly autocorrelated, up to the sampling noise's size)."""
        sd = float(rng.uniform(rel_lo, rel_hi))
        sampling = _ar1(rng, steps, float(rng.uniform(0, 0.3)))
        wander = rng.uniform(0.1, 0.7) * _ar1(rng, steps, float(rng.uniform(0.9, 0.98)), df=30)
        return sd * (sampling * sampled + wander * ("wander" in noise_parts))

    def settle(tau_lo: float, tau_hi: float) -> np.ndarray:  # 0 -> 1, concave
        return 1 - np.exp(-t / rng.uniform(tau_lo, tau_hi))

    s: Series = {}
    e0 = rng.uniform(0.3, 0.6)  # "often 0.3-0.6", falling as the policy sharpens
    s["actor/entropy"] = e0 * (1 - rng.uniform(0.2, 0.6) * settle(100, 400)) * np.exp(
        noise(0.01, 0.06))
    warm = 1 + rng.uniform(0, 1.5) * np.exp(-t / rng.uniform(10, 30))  # LR warm-up bump
    s["actor/kl"] = (0.001 + rng.uniform(0.05, 0.4) * settle(50, 300)) * np.exp(noise(0.03, 0.15))
    # healthy < 0.1 (the guide): the level stays under a quarter of it, and the rare heavy-tailed
    # excursion past it is cut (a healthy run that crossed it would be a fixed-pack false alarm)
    s["actor/logp_diff"] = np.minimum(0.095, rng.uniform(0.005, 0.025) * (
        1 + rng.uniform(-0.2, 0.2) * drift) * np.exp(noise(0.03, 0.15)))
    spikes = np.where((rng.random(steps) < 0.01) & sampled, rng.uniform(2, 5, steps), 1.0)
    s["actor/grad_norm"] = (np.exp(rng.uniform(math.log(0.05), math.log(0.8))) * warm
                            * (1 - rng.uniform(0, 0.3) * drift)
                            * np.exp(noise(0.05, 0.25)) * spikes)
    s["actor/clip_ratio"] = np.clip(rng.uniform(0.01, 0.08) * warm * np.exp(noise(0.05, 0.2)), 0, 1)
    s["actor/is_ratio"] = 1 + 0.005 * rng.standard_normal(steps)
    s["actor/is_ratio_min"] = rng.uniform(0.3, 0.7) * np.exp(noise(0.05, 0.15))
    max_len = float(rng.choice([1024, 2048]))
    length = rng.uniform(0.15, 0.45) * max_len * (1 + rng.uniform(-0.1, 0.6) * drift)
    s["rollout/response_length"] = np.minimum(length * np.exp(noise(0.01, 0.04)), max_len)
    s["rollout/clipped_ratio"] = np.clip(rng.uniform(0.0, 0.08) * (
        s["rollout/response_length"] / length[0]) ** 2 + 0.01 * rng.standard_normal(steps), 0, 1)
    r0 = rng.uniform(0.0, 0.3)
    reward = r0 + (rng.uniform(0.3, 0.8) - r0) * settle(30, 200)
    s["rollout/reward"] = np.clip(reward + noise(0.01, 0.05), 0, 1)
    s["rollout/frac_reward_zero_std"] = np.clip(
        rng.uniform(0.1, 0.5) + 0.05 * drift + noise(0.01, 0.04), 0, 0.79)
    if rng.random() < 0.5:  # asynchronous: rollouts up to one step staler than the usual lag
        base = int(rng.integers(1, 3))
        s["rollout/policy_lag"] = base + (rng.random(steps) < rng.uniform(0.1, 0.4)).astype(float)
    else:
        s["rollout/policy_lag"] = np.zeros(steps)
    return s, max_len


# --- faults ------------------------------------------------------------------------------------


def _progress(steps: int, onset: int, ramp: int) -> np.ndarray:
    """0 before the onset, rising linearly to 1 over ``ramp`` steps (1 at the onset if abrupt)."""
    return np.clip((np.arange(steps) - onset + 1) / ramp, 0, 1)


def _towards_log(values: np.ndarray, target: float, p: np.ndarray) -> np.ndarray:
    """Geometric interpolation to ``target`` (a multiplicative failure), noise kept."""
    return values * np.exp(p * (math.log(target) - np.log(np.maximum(values, 1e-9))))


def _entropy(s: Series, p: np.ndarray, _max_len: float) -> None:
    s["actor/entropy"] = s["actor/entropy"] * (1 - p) + 0.004 * p  # slides towards zero
    s["rollout/frac_reward_zero_std"] += (0.97 - s["rollout/frac_reward_zero_std"]) * p ** 2


def _kl(s: Series, p: np.ndarray, _max_len: float) -> None:
    s["actor/kl"] = _towards_log(s["actor/kl"], 3.0, p)


def _logprob(s: Series, p: np.ndarray, _max_len: float) -> None:
    s["actor/logp_diff"] = _towards_log(s["actor/logp_diff"], 1.5, p)
    s["actor/is_ratio_min"] = _towards_log(s["actor/is_ratio_min"], 0.02, p)


def _grad(s: Series, p: np.ndarray, _max_len: float) -> None:
    s["actor/grad_norm"] = _towards_log(s["actor/grad_norm"], 40.0, p)


def _clip(s: Series, p: np.ndarray, _max_len: float) -> None:
    s["actor/clip_ratio"] += (0.45 - s["actor/clip_ratio"]) * p


def _length(s: Series, p: np.ndarray, max_len: float) -> None:
    length = s["rollout/response_length"]
    s["rollout/response_length"] = np.minimum(length + (0.97 * max_len - length) * p, max_len)
    s["rollout/clipped_ratio"] += (0.92 - s["rollout/clipped_ratio"]) * p ** 2


def _reward(s: Series, p: np.ndarray, _max_len: float) -> None:
    s["rollout/reward"] = s["rollout/reward"] * (1 - p)  # the reward function stops paying
    s["rollout/frac_reward_zero_std"] += (1.0 - s["rollout/frac_reward_zero_std"]) * p


def _lag(s: Series, p: np.ndarray, _max_len: float) -> None:
    extra = np.floor(12 * p)  # rollouts fall ever further behind the trainer
    s["rollout/policy_lag"] = s["rollout/policy_lag"] + extra
    s["actor/logp_diff"] = s["actor/logp_diff"] * (1 + 0.15 * extra)
    s["actor/is_ratio_min"] = s["actor/is_ratio_min"] / (1 + 0.2 * extra)


@dataclass(frozen=True, slots=True)
class Fault:
    inject: Callable[[Series, np.ndarray, float], None]
    right: frozenset[str]  # alerts that name this failure


FAULTS: dict[str, Fault] = {
    "entropy_collapse": Fault(_entropy, frozenset({"EntropySliding", "EntropyCollapse"})),
    "kl_blowup": Fault(_kl, frozenset({"KLClimbing", "KLDivergence"})),
    "logprob_drift": Fault(_logprob, frozenset({
        "LogprobMismatchClimbing", "LogprobMismatch", "LogprobDivergence", "ISRatioStale"})),
    "grad_explosion": Fault(_grad, frozenset({"GradNormBlowingUp", "GradNormHigh"})),
    "clip_climb": Fault(_clip, frozenset({"ClipRatioClimbing", "ClipRatioHigh"})),
    "length_runaway": Fault(_length, frozenset({"ResponseLengthRunaway", "CompletionsTruncated"})),
    "reward_collapse": Fault(_reward, frozenset({
        "RewardCollapsing", "LearningSignalFading", "RewardStuck", "NoLearningSignal"})),
    "policy_lag": Fault(_lag, frozenset({
        "PolicyLagGrowing", "LogprobMismatchClimbing", "LogprobMismatch", "ISRatioStale"})),
}


@dataclass(frozen=True, slots=True)
class Case:
    """One simulated run: healthy when ``fault`` is None."""

    seed: int
    steps: int
    fault: str | None = None
    onset_kind: str = ""
    onset: int = 0
    ramp: int = 1


def fault_case(seed: int, fault: str, onset_kind: str) -> Case:
    rng = np.random.default_rng([seed, 7])
    lo, hi = ONSETS[onset_kind]
    ramp = int(rng.integers(lo, hi + 1))
    onset = int(rng.integers(60, 120))
    # long enough for the slowest rule of the fixed pack (RewardStuck: 20 steps at zero)
    return Case(seed, onset + ramp + 30, fault, onset_kind, onset, ramp)


def series_of(case: Case) -> Series:
    s, max_len = healthy_run(case.seed, case.steps)
    if case.fault == "policy_lag" and not s["rollout/policy_lag"].any():
        s["rollout/policy_lag"] = s["rollout/policy_lag"] + 1  # staleness needs an async run
    if case.fault is not None:
        FAULTS[case.fault].inject(s, _progress(case.steps, case.onset, case.ramp), max_len)
    return s


def records(s: Series, run: str) -> Iterable[StepRecord]:
    """Per step: the trainer's record (role actor) and the rollout's (role rollout)."""
    names = list(s)
    steps = len(s[names[0]])
    for step in range(steps):
        values = {name: float(s[name][step]) for name in names}
        actor = {n: v for n, v in values.items() if n in ACTOR}
        rollout = {n: v for n, v in values.items() if n not in ACTOR}
        yield StepRecord(run, "actor", step, True, 1, 1, (), actor)
        yield StepRecord(run, "rollout", step, True, 1, 1, (), rollout)


def firings(case: Case, rules: list[Rule]) -> list[tuple[str, int]]:
    """(alert, step) of every firing transition of ``rules`` on the case's run."""
    engine = AlertEngine(rules)
    out = []
    for record in records(series_of(case), f"run-{case.seed}"):
        out += [(e.alert, e.step) for e in engine.evaluate(record) if e.state == "firing"]
    return out


def pack(sensitivity: float = 1.0) -> list[Rule]:
    """The default pack, each early-warning rule's decision threshold scaled by ``sensitivity``."""
    return fixed_rules() + [
        rule.model_copy(update={"decision": rule.baseline.decision * sensitivity})
        if rule.condition is Condition.BASELINE else rule  # RewardHacking has its own detector
        for rule in early_warning_rules()]


def _run_case(job: tuple[Case, float]) -> tuple[Case, list[tuple[str, int]]]:
    case, sensitivity = job
    return case, firings(case, pack(sensitivity))


# --- report ------------------------------------------------------------------------------------


@dataclass
class PackResult:
    delays: dict[tuple[str, str], list[int | None]]  # (fault, onset kind) -> per run
    false_alarms: int = 0
    healthy_steps: int = 0
    early: int = 0  # alerts before the onset in fault runs
    early_steps: int = 0


def score(results: list[tuple[Case, list[tuple[str, int]]]], names: set[str]) -> PackResult:
    out = PackResult(delays={})
    for case, fired in results:
        mine = [(a, s) for a, s in fired if a in names]
        if case.fault is None:
            out.false_alarms += len(mine)
            out.healthy_steps += case.steps
            continue
        out.early += sum(1 for _, s in mine if s < case.onset)
        out.early_steps += case.onset
        right = FAULTS[case.fault].right
        first = min((s for a, s in mine if a in right and s >= case.onset), default=None)
        out.delays.setdefault((case.fault, case.onset_kind), []).append(
            None if first is None else first - case.onset)
    return out


def _fmt_delays(values: list[int | None]) -> str:
    caught = [v for v in values if v is not None]
    if not caught:
        return f"0/{len(values)} caught"
    mean = statistics.fmean(caught)
    return (f"{len(caught)}/{len(values)}  mean {mean:5.1f}  median {statistics.median(caught):4.0f}"
            f"  max {max(caught):3d}")


def gradual_mean(pack_result: PackResult) -> tuple[float, int, int]:
    """Mean onset-to-alert delay of the gradual faults caught, runs caught, runs."""
    delays = [v for k, vs in pack_result.delays.items() if k[1] == "gradual" for v in vs]
    caught = [v for v in delays if v is not None]
    return (statistics.fmean(caught) if caught else math.nan), len(caught), len(delays)


def report(results: list[tuple[Case, list[tuple[str, int]]]]) -> dict[str, PackResult]:
    fixed = {r.name for r in fixed_rules()}
    packs = {"fixed": score(results, fixed), "early": score(results, {
        r.name for r in default_rules()})}
    keys = sorted(packs["fixed"].delays, key=lambda k: (list(FAULTS).index(k[0]),
                                                        list(ONSETS).index(k[1])))
    print(f"{'fault':<17}{'onset':<9}{'fixed-threshold pack':<44}{'with early-warning rules'}")
    for key in keys:
        print(f"{key[0]:<17}{key[1]:<9}{_fmt_delays(packs['fixed'].delays[key]):<44}"
              f"{_fmt_delays(packs['early'].delays[key])}")
    for kind in ONSETS:
        cells = []
        for pack in packs.values():
            caught = [v for k, vs in pack.delays.items() if k[1] == kind for v in vs
                      if v is not None]
            total = sum(len(vs) for k, vs in pack.delays.items() if k[1] == kind)
            cells.append(f"{len(caught)}/{total} caught, mean {statistics.fmean(caught):.2f} steps"
                         if caught else f"0/{total} caught")
        print(f"{'all faults':<17}{kind:<9}{cells[0]:<44}{cells[1]}")
    for name, pack in packs.items():
        rate = 1000 * pack.false_alarms / max(pack.healthy_steps, 1)
        pre = 1000 * pack.early / max(pack.early_steps, 1)
        print(f"{name:>5} pack: {pack.false_alarms} false alarms in {pack.healthy_steps} healthy "
              f"steps ({rate:.2f} per 1,000); {pack.early} alerts before onset in fault runs "
              f"({pre:.2f} per 1,000 pre-onset steps)")
    return packs


PLOTTED = (("entropy_collapse", "actor/entropy"), ("kl_blowup", "actor/kl"),
           ("grad_explosion", "actor/grad_norm"), ("length_runaway", "rollout/response_length"))


def _expected(rule: Rule, values: np.ndarray) -> np.ndarray:
    """The early-warning rule's baseline at every step (NaN during warm-up), in metric units."""
    params = rule.baseline
    out = np.full(len(values), np.nan)
    history: deque[float] = deque()
    for i, value in enumerate(values):
        if len(history) >= params.warmup:
            expected, _ = predict(params, history)
            out[i] = expected if params.log_offset is None else (
                math.exp(expected) - params.log_offset)
        history.append(float(value))
        while len(history) > params.window:
            history.popleft()
    return out


def plot(path: Path, seed: int) -> None:
    """Four gradual faults of one held-out seed: the metric, its learned baseline, the fixed
    threshold, and where each pack first alerted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rules = {r.name: r for r in default_rules()}
    fixed = {r.name for r in fixed_rules()}
    fig, axes = plt.subplots(2, 2, figsize=(11, 7), constrained_layout=True)
    for ax, (fault, metric) in zip(axes.flat, PLOTTED, strict=True):
        case = fault_case(seed, fault, "gradual")
        values = series_of(case)[metric]
        fired = firings(case, default_rules())
        right = FAULTS[fault].right
        first = {pack: min((s for a, s in fired if a in right and s >= case.onset
                            and (a in fixed) == (pack == "fixed")), default=None)
                 for pack in ("fixed", "early")}
        early_rule = next(r for r in early_warning_rules() if r.metric == metric)
        steps = np.arange(len(values))
        ax.plot(steps, values, color="0.2", lw=1, label=metric)
        ax.plot(steps, _expected(early_rule, values), color="tab:blue", lw=1, ls="--",
                label=f"{early_rule.name}: learned baseline")
        for name in right & fixed:
            rule = rules[name]
            if rule.metric == metric and rule.threshold is not None:
                ax.axhline(rule.threshold, color="tab:red", lw=1, ls=":",
                           label=f"{name} threshold {rule.threshold:g}")
        ax.axvline(case.onset, color="0.5", lw=1, label=f"fault onset (step {case.onset})")
        for pack, colour in (("early", "tab:blue"), ("fixed", "tab:red")):
            step = first[pack]
            if step is not None:
                ax.scatter([step], [values[step]], color=colour, zorder=3, s=36,
                           label=f"{'early-warning' if pack == 'early' else 'fixed'} pack alerts "
                                 f"(+{step - case.onset} steps)")
        if metric in ("actor/kl", "actor/grad_norm"):
            ax.set_yscale("log")
        ax.set_xlim(case.onset - 60, len(values))
        ax.set_title(f"{fault.replace('_', ' ')}: ramp of {case.ramp} steps", fontsize=10)
        ax.set_xlabel("step")
        ax.legend(fontsize=7, loc="best")
    fig.suptitle(f"Gradual faults, held-out seed {seed}: the baseline rules fire while the "
                 "metric is still inside the fixed thresholds", fontsize=11)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --- the perfect-baseline bound -----------------------------------------------------------------

# the continuous metrics a fault moves (fault -> metric, its direction, judged in log space)
BOUND_METRICS = {
    "entropy_collapse": ("actor/entropy", -1, True), "kl_blowup": ("actor/kl", 1, True),
    "logprob_drift": ("actor/logp_diff", 1, True), "grad_explosion": ("actor/grad_norm", 1, True),
    "clip_climb": ("actor/clip_ratio", 1, True),
    "length_runaway": ("rollout/response_length", 1, True),
    "reward_collapse": ("rollout/reward", -1, False),
}
BOUND_ALLOWANCES = (1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0)
BOUND_DECISIONS = (1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 12.0, 16.0, 20.0)
BOUND_WARMUP = 20


def _oracle_z(seed: int, steps: int, fault: str, known: frozenset[str],
              case: Case | None = None) -> np.ndarray:
    """The metric of ``fault`` against the run's own trajectory with only the ``known`` noise
    parts in it, in units of the robust SD of the noise the oracle does not know, signed so a
    fault is positive; ``case`` puts the fault in (the reference and the scale stay healthy)."""
    metric, sign, log = BOUND_METRICS[fault]

    def space(values: np.ndarray) -> np.ndarray:
        return np.log(np.maximum(values, 1e-9)) if log else values

    reference = space(healthy_run(seed, steps, known)[0][metric])
    residual = space(healthy_run(seed, steps)[0][metric]) - reference
    scale = 1.4826 * float(np.median(np.abs(residual - np.median(residual))))
    observed = space(series_of(case)[metric]) if case is not None else reference + residual
    return sign * (observed - reference) / scale


def _alarms(z: np.ndarray, allowance: float, decision: float, for_steps: int) -> np.ndarray:
    """Where the product's CUSUM (z clipped so one step cannot fire, score capped at twice the
    decision) has held ``decision`` for ``for_steps`` steps; rows are runs, NaN pads."""
    cap = allowance + decision / 2
    score = np.zeros(len(z))
    scores = np.zeros(z.shape)  # 0 in the warm-up
    for t in range(BOUND_WARMUP, z.shape[1]):
        step = np.nan_to_num(np.minimum(z[:, t], cap), nan=-np.inf)
        score = np.minimum(np.maximum(0.0, score + step - allowance), 2 * decision)
        scores[:, t] = score
    return _held(scores >= decision, for_steps)


def _padded(rows: list[np.ndarray]) -> np.ndarray:
    out = np.full((len(rows), max(len(r) for r in rows)), np.nan)
    for i, row in enumerate(rows):
        out[i, :len(row)] = row
    return out


def _held(above: np.ndarray, for_steps: int) -> np.ndarray:
    """Where ``above`` has held for the last ``for_steps`` steps (rows are runs)."""
    out = above.copy()
    for back in range(1, for_steps):
        out[:, back:] &= above[:, :-back]
        out[:, :back] = False
    return out


def _ramp_statistic(z: np.ndarray, window: int, cap: float) -> np.ndarray:
    """The matched filter for a linear ramp, the other statistic the bound tries: at each step, the
    largest over onsets in the last ``window`` steps of sum_j (j + 1) z[onset + j] normalised to
    unit variance (a generalised likelihood ratio for a ramp of unknown onset and slope); z is
    clipped at ``cap``. Rows are runs, NaN pads (never fires there); nothing in the warm-up."""
    valid = ~np.isnan(z)
    clipped = np.where(valid, np.minimum(z, cap), 0.0)
    zeros = np.zeros((len(z), 1))
    plain = np.hstack([zeros, np.cumsum(clipped, axis=1)])  # plain[:, t + 1]: sum up to t
    indexed = np.hstack([zeros, np.cumsum(clipped * np.arange(z.shape[1]), axis=1)])
    best = np.full(z.shape, -np.inf)
    for back in range(window):  # onset = t - back
        t = np.arange(back, z.shape[1])
        onset = t - back
        total = plain[:, t + 1] - plain[:, onset]
        # sum over i in [onset, t] of (i - onset + 1) z_i
        weighted = indexed[:, t + 1] - indexed[:, onset] - (onset - 1) * total
        norm = math.sqrt((back + 1) * (back + 2) * (2 * back + 3) / 6)
        best[:, back:] = np.maximum(best[:, back:], weighted / norm)
    best[~valid] = -np.inf
    best[:, :BOUND_WARMUP] = -np.inf
    return best


RAMP_WINDOWS = (3, 5, 8, 12)
RAMP_CAPS = (2.0, 3.0, 4.0, 6.0, 8.0, 12.0)
RAMP_DECISIONS = tuple(float(h) for h in np.arange(2.0, 14.01, 0.25))

# a detector family's candidates: each setting with its alarms on the healthy and the faulty z
Candidates = Iterable[tuple[tuple[float, ...], np.ndarray, np.ndarray]]
Family = Callable[[np.ndarray, np.ndarray], Candidates]


def _cusum_family(healthy: np.ndarray, faults: np.ndarray) -> Candidates:
    for allowance in BOUND_ALLOWANCES:
        for decision in BOUND_DECISIONS:
            for for_steps in (1, 2):
                yield ((allowance, decision, for_steps),
                       _alarms(healthy, allowance, decision, for_steps),
                       _alarms(faults, allowance, decision, for_steps))


def _ramp_family(healthy: np.ndarray, faults: np.ndarray) -> Candidates:
    for window in RAMP_WINDOWS:
        for cap in RAMP_CAPS:
            quiet, faulty = _ramp_statistic(healthy, window, cap), _ramp_statistic(faults, window, cap)
            for decision in RAMP_DECISIONS:
                if cap >= decision:  # one step alone must not fire, as in the product
                    continue
                for for_steps in (1, 2):
                    yield ((window, cap, decision, for_steps),
                           _held(quiet >= decision, for_steps), _held(faulty >= decision, for_steps))


FAMILIES: dict[str, tuple[Family, str]] = {
    "cusum": (_cusum_family, "the product's CUSUM (allowance, decision, steps held)"),
    "ramp": (_ramp_family, "a matched filter for a linear ramp (window, z cap, decision, "
             "steps held)"),
}


def _bound_one(job: tuple[str, str, frozenset[str], list[int], int]
               ) -> tuple[float, tuple[float, ...]]:
    """(mean gradual delay, settings) of the fastest detector of ``family`` fed oracle z-scores,
    with at most ``budget`` false alarms on the seeds' healthy runs and the faults' pre-onset
    steps; (inf, ()) if no setting catches every fault."""
    family, fault, known, seeds, budget = job
    healthy = _padded([_oracle_z(c.seed, c.steps, fault, known) for c in cases(seeds)
                       if c.fault is None])
    faulty = [fault_case(seed, fault, "gradual") for seed in seeds]
    faults = _padded([_oracle_z(c.seed, c.steps, fault, known, c) for c in faulty])
    onsets = np.array([c.onset for c in faulty])
    after = np.arange(faults.shape[1])[None, :] >= onsets[:, None]
    best: tuple[float, tuple[float, ...]] = (math.inf, ())
    for settings, quiet, fired in FAMILIES[family][0](healthy, faults):
        false = int(quiet.any(axis=1).sum()) + int((fired & ~after).any(axis=1).sum())
        hit = fired & after
        if false > budget or not hit.any(axis=1).all():
            continue
        mean = float(np.mean(hit.argmax(axis=1) - onsets))
        if mean < best[0]:
            best = (mean, settings)
    return best


def bound(seeds: range, budget: int, jobs: int) -> int:
    """Print, per fault and detector family, the fastest it could catch the gradual fault if it
    knew the run's noise-free trajectory (and, second, its slow wander too) instead of learning a
    baseline."""
    print(f"perfect-baseline bound, seeds {seeds.start}-{seeds.stop - 1}, at most {budget} false "
          "alarm(s) on their healthy runs and pre-onset steps; gradual faults, mean steps from "
          "onset:")
    knowns: tuple[frozenset[str], ...] = (frozenset(), frozenset({"wander"}))
    todo = [(family, fault, known, list(seeds), budget)
            for family in FAMILIES for fault in BOUND_METRICS for known in knowns]
    with multiprocessing.Pool(jobs) as pool:
        found = iter(pool.map(_bound_one, todo))
    for _, settings in FAMILIES.values():
        print(f"\n{settings}")
        print(f"{'fault':<18}{'trajectory known':<30}{'trajectory and wander known'}")
        for fault in BOUND_METRICS:
            cells = [f"{mean:.2f} ({', '.join(f'{v:g}' for v in chosen)})"
                     if math.isfinite(mean) else "none caught all"
                     for mean, chosen in (next(found), next(found))]
            print(f"{fault:<18}{cells[0]:<30}{cells[1]}")
    return 0


def cases(seeds: Iterable[int]) -> list[Case]:
    seeds = list(seeds)
    out = [Case(seed, length) for length in HEALTHY_LENGTHS for seed in seeds
           if length != 1000 or seed % 4 == 0]  # long runs: a quarter of the seeds
    out += [fault_case(seed, fault, kind) for seed in seeds for fault in FAULTS
            for kind in ONSETS]
    return out


def sensitivity(todo: list[Case], factors: list[float], jobs: int) -> int:
    """One line per decision scale: gradual speed against false alarms (healthy runs and before
    the onsets), the early-warning pack with the thresholds."""
    early = {r.name for r in default_rules()}
    print("decision x  gradual mean  caught     false alarms / 1,000 healthy steps  "
          "(+ before onsets)  quiet 300-step runs")
    with multiprocessing.Pool(jobs) as pool:
        for factor in factors:
            results = pool.map(_run_case, [(case, factor) for case in todo], chunksize=8)
            result = score(results, early)
            mean, caught, total = gradual_mean(result)
            runs = [fired for c, fired in results if c.fault is None and c.steps == 300]
            print(f"{factor:<11g} {mean:<13.2f} {caught}/{total:<6} "
                  f"{1000 * result.false_alarms / max(result.healthy_steps, 1):<36.3f}"
                  f"{1000 * result.early / max(result.early_steps, 1):<19.3f}"
                  f"{sum(1 for fired in runs if not fired)}/{len(runs)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", choices=("held-out", "tuning"), default="held-out")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--plot", metavar="PATH", help="write the figure of docs/early-warning.md (PNG)")
    parser.add_argument("--sensitivity", metavar="F,F,...",
                        help="print the speed / false-alarm trade-off at these decision scales")
    parser.add_argument("--bound", type=int, metavar="FALSE_ALARMS", nargs="?", const=0,
                        help="print the perfect-baseline bound allowing this many false alarms "
                        "(default 0) instead")
    args = parser.parse_args(argv)
    seeds = HELD_OUT_SEEDS if args.seeds == "held-out" else TUNING_SEEDS
    if args.bound is not None:
        return bound(seeds, args.bound, args.jobs)
    todo = cases(seeds)
    if args.sensitivity:
        return sensitivity(todo, [float(f) for f in args.sensitivity.split(",")], args.jobs)
    start = time.perf_counter()
    with multiprocessing.Pool(args.jobs) as pool:
        results = pool.map(_run_case, [(case, 1.0) for case in todo], chunksize=8)
    elapsed = time.perf_counter() - start
    healthy = [c for c in results if c[0].fault is None]
    print(f"detection benchmark: {args.seeds} seeds {seeds.start}-{seeds.stop - 1}; "
          f"{len(healthy)} healthy runs ("
          + ", ".join(f"{sum(1 for c, _ in healthy if c.steps == n)} x {n} steps"
                      for n in HEALTHY_LENGTHS)
          + f"), {len(results) - len(healthy)} fault runs; "
          f"{len(early_warning_rules())} early-warning rules; {elapsed:.1f} s on {args.jobs} "
          "processes")
    print("steps from onset to the first right alert (0 = at the onset step), runs caught:")
    packs = report(results)
    target_300 = [c for c in results if c[0].fault is None and c[0].steps == 300]
    quiet = sum(1 for c, fired in target_300 if not fired)
    print(f"healthy 300-step runs with no alert at all (both packs): {quiet}/{len(target_300)}")
    every = all(v is not None for vs in packs["early"].delays.values() for v in vs)
    mean_gradual = gradual_mean(packs["early"])[0]
    print(f"targets: every fault caught: {'yes' if every else 'NO'}; gradual mean "
          f"{mean_gradual:.2f} <= 3: {'yes' if mean_gradual <= 3 else 'NO'}; 0 false alarms on "
          f"{len(target_300)} healthy 300-step runs: "
          f"{'yes' if quiet == len(target_300) else 'NO'}")
    if args.plot:
        plot(Path(args.plot), seeds.start)
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
