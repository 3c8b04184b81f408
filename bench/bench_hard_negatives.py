"""Hard-negative benchmark: healthy runs that look like faults, and what rlmon sends about them.

Each kind below is a healthy GRPO run with one benign change that a naive detector mistakes for a
fault: a learning-rate warm-up, a fast learner, steady length growth, a curriculum switch, a slow
KL drift, single-step gradient-norm outliers, small-batch noise, a steady one-step off-policy
mismatch whose ``actor/logp_diff`` sits near ``LogprobMismatch``'s 0.1, an LR warm restart, a
model that learns to be concise, and more (15 kinds). The runs are
written as contract records (docs/contract.md, one rank per role, a step every ``--step-seconds``)
and go through ``rlmon replay``'s own code (:func:`rlmon.service.replay.replay`: assembly, the
default rule pack, the time-based rules), then through the service's routing with the default
severity routes (warning: Slack; critical: PagerDuty and Slack), so what is counted is what a
person would have received.

Figures, per kind and overall:

- **notifications per run-hour**: Slack messages and PagerDuty events (triggers, resolves,
  re-sends), over the runs' length at the step period;
- **flaps**: an alert that fires again within ``--flap-steps`` steps of its resolve on the same
  stream (a condition that never went away);
- **false critical**: firings at critical severity (escalations included) on a healthy run.

The kinds' parameters are drawn from each run's seed; ``--seeds`` picks the seed base (the
figures in docs/benchmarks.md use the default, 7000). Nothing here was tuned against the rule
pack: a kind is a healthy run as the literature describes it, and counts what rlmon makes of it.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from rlmon.service.alerting.engine import AlertEvent
from rlmon.service.alerting.notify.routing import route
from rlmon.service.config import Settings
from rlmon.service.metrics import catalog
from rlmon.service.metrics.forms import FORMS
from rlmon.service.replay import replay

Series = dict[str, np.ndarray]
ACTOR = ("actor/entropy", "actor/kl", "actor/logp_diff", "actor/grad_norm", "actor/clip_ratio",
         "actor/is_ratio", "actor/is_ratio_min", "actor/lr")
T0 = 1_800_000_000.0  # the runs' first step, unix seconds


def _ar1(rng: np.random.Generator, n: int, phi: float) -> np.ndarray:
    """Unit-variance AR(1) noise with Student-t(5) innovations."""
    shocks = rng.standard_t(5.0, n) / math.sqrt(5.0 / 3.0)
    out = np.empty(n)
    prev = float(rng.standard_normal())
    scale = math.sqrt(1 - phi * phi)
    for i in range(n):
        prev = phi * prev + scale * shocks[i]
        out[i] = prev
    return out


@dataclass
class Run:
    """One healthy run under construction: its metrics and the tools to change them."""

    rng: np.random.Generator
    steps: int
    noise_scale: float = 1.0
    s: Series = field(default_factory=dict)

    @property
    def t(self) -> np.ndarray:
        return np.arange(self.steps, dtype=float)

    def noise(self, sd: float, phi: float = 0.3) -> np.ndarray:
        """Sampling noise (weakly autocorrelated) plus a slow wander of the policy."""
        n = self.steps
        wander = 0.4 * _ar1(self.rng, n, 0.95)
        return sd * self.noise_scale * (_ar1(self.rng, n, phi) + wander)

    def settle(self, tau: float) -> np.ndarray:
        return 1 - np.exp(-self.t / tau)

    def u(self, lo: float, hi: float) -> float:
        return float(self.rng.uniform(lo, hi))


def base(rng: np.random.Generator, steps: int, noise_scale: float = 1.0) -> tuple[Run, float]:
    """A calm healthy run (in the Axolotl guide's ranges), and its response-length limit."""
    r = Run(rng, steps, noise_scale)
    s = r.s
    s["actor/entropy"] = r.u(0.3, 0.6) * (1 - r.u(0.1, 0.35) * r.settle(200)) * np.exp(
        r.noise(0.03))
    s["actor/kl"] = (0.002 + r.u(0.05, 0.3) * r.settle(150)) * np.exp(r.noise(0.08))
    s["actor/logp_diff"] = r.u(0.01, 0.03) * np.exp(r.noise(0.08))
    s["actor/grad_norm"] = r.u(0.1, 0.6) * np.exp(r.noise(0.15))
    s["actor/clip_ratio"] = np.clip(r.u(0.01, 0.06) * np.exp(r.noise(0.1)), 0, 1)
    s["actor/is_ratio"] = 1 + 0.005 * rng.standard_normal(steps)
    s["actor/is_ratio_min"] = r.u(0.3, 0.7) * np.exp(r.noise(0.1))
    s["actor/lr"] = np.full(steps, 1e-6)
    r0, r1 = r.u(0.05, 0.3), r.u(0.5, 0.8)
    s["rollout/reward"] = np.clip(r0 + (r1 - r0) * r.settle(r.u(60, 200)) + r.noise(0.02), 0, 1)
    s["rollout/reward_std"] = np.clip(r.u(0.2, 0.4) + r.noise(0.02), 0.01, 1)
    s["rollout/frac_reward_zero_std"] = np.clip(r.u(0.1, 0.4) + r.noise(0.03), 0, 0.95)
    max_len = float(rng.choice([1024, 2048, 4096]))
    s["rollout/response_length"] = np.minimum(
        r.u(0.1, 0.3) * max_len * (1 + r.u(0, 0.3) * np.minimum(r.t, 300) / 300)
        * np.exp(r.noise(0.03)), max_len)
    s["rollout/clipped_ratio"] = np.clip(r.u(0.0, 0.05) + r.noise(0.01), 0, 1)
    s["rollout/policy_lag"] = np.zeros(steps)
    return r, max_len


# --- the kinds: each changes a calm run in one benign way ---------------------------------------


def lr_warmup(r: Run, _max_len: float) -> None:
    """LR ramps from 0 over 30-80 steps: early gradients are large and fall, clip ratio and KL
    grow with the LR, then settle."""
    s, w = r.s, r.u(30, 80)
    ramp = np.minimum(1.0, (r.t + 1) / w)
    s["actor/lr"] = 1e-6 * ramp
    s["actor/grad_norm"] = s["actor/grad_norm"] * (1 + r.u(3, 8) * np.exp(-r.t / r.u(10, 30)))
    s["actor/clip_ratio"] = np.clip(s["actor/clip_ratio"] * (0.2 + 1.3 * ramp), 0, 1)
    s["actor/kl"] = s["actor/kl"] * (0.3 + 0.7 * ramp)


def fast_learner(r: Run, _max_len: float) -> None:
    """The task is easy for this model: reward from ~0.1 to ~0.9 in 30-60 steps, entropy falls
    to a quarter, most groups become all-correct (ties), KL rises quickly, then all settle."""
    s = r.s
    mid, width = r.u(20, 50), r.u(5, 12)
    p = 1 / (1 + np.exp(-(r.t - mid) / width))
    s["rollout/reward"] = np.clip(0.1 + r.u(0.75, 0.85) * p + r.noise(0.02), 0, 1)
    s["actor/entropy"] = s["actor/entropy"] * (1 - r.u(0.6, 0.75) * p)
    s["rollout/frac_reward_zero_std"] = np.clip(
        0.2 + r.u(0.4, 0.55) * p + r.noise(0.03), 0, 0.95)
    s["rollout/reward_std"] = np.clip(0.4 - 0.3 * p + r.noise(0.02), 0.01, 1)
    s["actor/kl"] = s["actor/kl"] + r.u(0.2, 0.5) * p


def length_growth(r: Run, max_len: float) -> None:
    """Reasoning gets longer (R1-style): length doubles or triples over the run, well under the
    limit, and a few more completions reach it."""
    s = r.s
    grow = 1 + r.u(1.0, 2.0) * r.t / r.steps
    start = r.u(0.08, 0.15) * max_len
    s["rollout/response_length"] = np.minimum(start * grow * np.exp(r.noise(0.03)), max_len)
    s["rollout/clipped_ratio"] = np.clip(0.01 + 0.1 * (grow - 1) / 2 + r.noise(0.01), 0, 1)


def curriculum_switch(r: Run, _max_len: float) -> None:
    """At a step between 150 and 250 the data set switches to harder prompts: the reward drops
    at once, more groups tie (all wrong), entropy and length jump up, KL bumps."""
    s = r.s
    at = int(r.u(150, 250))
    after = (r.t >= at).astype(float)
    recover = after * (1 - np.exp(-(r.t - at).clip(0) / r.u(60, 150)))
    s["rollout/reward"] = np.clip(
        s["rollout/reward"] * (1 - after * r.u(0.5, 0.7) * (1 - 0.6 * recover)), 0, 1)
    s["rollout/frac_reward_zero_std"] = np.clip(
        s["rollout/frac_reward_zero_std"] + after * r.u(0.15, 0.3) * (1 - recover), 0, 0.95)
    s["actor/entropy"] = s["actor/entropy"] * (1 + after * r.u(0.2, 0.4))
    s["rollout/response_length"] = s["rollout/response_length"] * (1 + after * r.u(0.3, 0.6))
    s["actor/kl"] = s["actor/kl"] * (1 + after * r.u(0.3, 0.8) * np.exp(-(r.t - at).clip(0) / 30))


def kl_drift(r: Run, _max_len: float) -> None:
    """KL to the reference grows steadily all run long, to 1.2-1.8 (under the 2.0 bound)."""
    s = r.s
    s["actor/kl"] = (0.02 + r.u(1.2, 1.8) * r.t / r.steps) * np.exp(r.noise(0.06))


def grad_outliers(r: Run, _max_len: float) -> None:
    """Single-step gradient-norm outliers (a hard batch): 3% of steps, 5-40x the usual norm."""
    s = r.s
    spikes = np.where(r.rng.random(r.steps) < 0.03, r.rng.uniform(5, 40, r.steps), 1.0)
    s["actor/grad_norm"] = s["actor/grad_norm"] * spikes


def small_batch(r: Run, _max_len: float) -> None:
    """A small batch: every metric's sampling noise three to four times larger."""
    scale = r.u(3.0, 4.0)
    rebuilt, _ = base(r.rng, r.steps, noise_scale=scale)
    r.s.update(rebuilt.s)
    r.s["rollout/reward"] = np.clip(r.s["rollout/reward"] + r.noise(0.03) * scale, 0, 1)


def offpolicy_steady(r: Run, _max_len: float) -> None:
    """One-step off-policy rollouts (async): a steady trainer/rollout mismatch whose token-mean
    |logp diff| sits at 0.09-0.11, straddling LogprobMismatch's 0.1, and a policy lag of 1."""
    s = r.s
    s["actor/logp_diff"] = r.u(0.09, 0.11) * np.exp(r.noise(0.05))
    s["actor/is_ratio_min"] = r.u(0.15, 0.3) * np.exp(r.noise(0.08))
    s["actor/is_ratio"] = 1 + 0.01 * r.rng.standard_normal(r.steps)
    s["rollout/policy_lag"] = np.ones(r.steps)


def entropy_sharpening(r: Run, _max_len: float) -> None:
    """A sampling-temperature-1 start: entropy from 0.8-1.0 to 0.12-0.2 in 50-120 steps (the
    policy sharpens), then flat; nowhere near a collapse."""
    s = r.s
    hi, lo = r.u(0.8, 1.0), r.u(0.12, 0.2)
    s["actor/entropy"] = (lo + (hi - lo) * np.exp(-r.t / r.u(25, 60))) * np.exp(r.noise(0.03))


def async_lag_jitter(r: Run, _max_len: float) -> None:
    """Asynchronous rollouts with a lag of 2 that often reaches 3 or 4 (queue jitter); the
    mismatch follows the lag a little."""
    s = r.s
    jitter = (r.rng.random(r.steps) < r.u(0.2, 0.4)).astype(float) * r.rng.integers(
        1, 3, r.steps)
    s["rollout/policy_lag"] = 2 + jitter
    s["actor/logp_diff"] = s["actor/logp_diff"] * (1 + 0.15 * jitter)


def kl_spikes(r: Run, _max_len: float) -> None:
    """Single-step KL spikes past 2.0 (a batch of unusual prompts), 1-2% of steps."""
    s = r.s
    spikes = np.where(r.rng.random(r.steps) < 0.015, r.rng.uniform(2.2, 6.0, r.steps), 0.0)
    s["actor/kl"] = s["actor/kl"] + spikes


def saturated_reward(r: Run, _max_len: float) -> None:
    """The model solves most prompts: reward at 0.93-0.98 with little variance and 70-85% of
    groups tied at all-correct, steady (the data set is too easy, not broken)."""
    s = r.s
    s["rollout/reward"] = np.clip(r.u(0.93, 0.98) + r.noise(0.005), 0, 1)
    s["rollout/frac_reward_zero_std"] = np.clip(r.u(0.7, 0.85) + r.noise(0.02), 0, 0.97)
    s["rollout/reward_std"] = np.clip(0.08 + r.noise(0.01), 0.01, 1)


def clip_warm(r: Run, _max_len: float) -> None:
    """A larger learning rate: clip ratio at 0.15-0.25 all run long (healthy for GRPO with many
    mini-batches per step), with its usual noise."""
    s = r.s
    s["actor/clip_ratio"] = np.clip(r.u(0.15, 0.25) * np.exp(r.noise(0.08)), 0, 1)


def lr_restart(r: Run, _max_len: float) -> None:
    """A cosine schedule with a warm restart half-way: the LR falls to a tenth, then jumps back;
    gradient norm, clip ratio and KL follow it for a while."""
    s = r.s
    at = int(r.u(0.4, 0.6) * r.steps)
    phase = np.where(r.t < at, r.t / at, (r.t - at) / (r.steps - at))
    lr = 1e-7 + 0.9e-6 * 0.5 * (1 + np.cos(np.pi * phase))
    s["actor/lr"] = lr
    gain = lr / 1e-6
    s["actor/grad_norm"] = s["actor/grad_norm"] * (0.7 + 0.6 * gain)
    s["actor/clip_ratio"] = np.clip(s["actor/clip_ratio"] * (0.3 + 1.2 * gain), 0, 1)
    s["actor/kl"] = s["actor/kl"] * (1 + 0.5 * (r.t >= at) * gain)


def length_shrink(r: Run, max_len: float) -> None:
    """The model learns to be concise (a length penalty in the reward): response length falls by
    a third to a half over 100-200 steps while the reward still rises; entropy dips a little."""
    s = r.s
    p = 1 - np.exp(-r.t / r.u(50, 100))
    s["rollout/response_length"] = s["rollout/response_length"] * (1 - r.u(0.33, 0.5) * p)
    s["rollout/clipped_ratio"] = np.clip(s["rollout/clipped_ratio"] * (1 - p), 0, 1)
    s["actor/entropy"] = s["actor/entropy"] * (1 - 0.15 * p)


KINDS: dict[str, Callable[[Run, float], None]] = {
    "lr_warmup": lr_warmup, "fast_learner": fast_learner, "length_growth": length_growth,
    "curriculum_switch": curriculum_switch, "kl_drift": kl_drift,
    "grad_outliers": grad_outliers, "small_batch": small_batch,
    "offpolicy_steady": offpolicy_steady, "entropy_sharpening": entropy_sharpening,
    "async_lag_jitter": async_lag_jitter, "kl_spikes": kl_spikes,
    "saturated_reward": saturated_reward, "clip_warm": clip_warm, "lr_restart": lr_restart,
    "length_shrink": length_shrink,
}


def run_series(kind: str, seed: int, steps: int) -> Series:
    rng = np.random.default_rng([seed, list(KINDS).index(kind)])
    run, max_len = base(rng, steps)
    KINDS[kind](run, max_len)
    return run.s


def _partial(name: str, value: float) -> dict[str, float]:
    spec = catalog.get(name)
    form = next(FORMS[f] for f in spec.forms if FORMS[f].of_value is not None)
    assert form.of_value is not None
    return form.as_keys(form.of_value(value))


def contract_lines(s: Series, run: str, step_seconds: float) -> Iterator[str]:
    """The run as a partial-report file: per step, the trainer's record (role actor) and the
    rollout's (role rollout), one rank each, timed at the step period."""
    steps = len(next(iter(s.values())))
    for step in range(steps):
        for role in ("actor", "rollout"):
            metrics = {n: _partial(n, float(v[step])) for n, v in s.items()
                       if (n in ACTOR) == (role == "actor")}
            yield json.dumps({"run": run, "role": role, "step": step,
                              "time": T0 + step * step_seconds, "metrics": metrics})


# --- figures ------------------------------------------------------------------------------------


@dataclass
class Tally:
    runs: int = 0
    hours: float = 0.0
    notifications: int = 0
    slack: int = 0
    pagerduty: int = 0
    firings: int = 0
    flaps: int = 0
    false_critical: int = 0
    held: int = 0  # transitions over the engine's per-hour bound: stored, not sent
    escalations: int = 0
    alerts: Counter[str] = field(default_factory=Counter)  # firings by alert
    worst: int = 0  # most notifications of one run

    def add(self, other: Tally) -> None:
        for name in ("runs", "hours", "notifications", "slack", "pagerduty", "firings", "flaps",
                     "false_critical", "held", "escalations"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.alerts.update(other.alerts)
        self.worst = max(self.worst, other.worst)


def _settings() -> Settings:
    return Settings()  # the default routes: warning -> slack, critical -> pagerduty + slack


def measure(events: list[AlertEvent], hours: float, flap_steps: int) -> Tally:
    """What ``events`` (one run's transitions, in order) cost a person."""
    tally = Tally(runs=1, hours=hours)
    routed = route(events, _settings(), {"slack", "pagerduty"})
    by = Counter(n.destination for n in routed.notifications)
    tally.slack, tally.pagerduty = by["slack"], by["pagerduty"]
    tally.notifications = tally.slack + tally.pagerduty
    tally.worst = tally.notifications
    # an update of a heading that moved later is not sent either, by design, not by the bound
    tally.held = sum(1 for e in events if not getattr(e, "notify", True)
                     and not getattr(e, "repeat", False))  # older engines: none
    resolved_at: dict[tuple[str, str, str], int] = {}
    for e in events:
        key = (e.run, e.role, e.alert)
        if e.state == "resolved":
            resolved_at[key] = e.step
            continue
        if getattr(e, "repeat", False):
            continue  # a re-send of a firing alert: counted in the notifications only
        tally.firings += 1
        tally.escalations += bool(getattr(e, "escalated_from", ""))
        tally.alerts[e.alert] += 1
        if e.severity == "critical":
            tally.false_critical += 1
        last = resolved_at.get(key)
        if last is not None and e.step - last <= flap_steps:
            tally.flaps += 1
    return tally


def run_kind(kind: str, seeds: range, steps: int, step_seconds: float,
             flap_steps: int) -> Tally:
    total = Tally()
    for seed in seeds:
        result = replay(contract_lines(run_series(kind, seed, steps), f"{kind}-{seed}",
                                       step_seconds))
        if result.errors:
            raise SystemExit(f"{kind} seed {seed}: the replay rejected lines: "
                             f"{result.errors[0].error}")
        total.add(measure(result.alerts, steps * step_seconds / 3600.0, flap_steps))
    return total


def _row(name: str, t: Tally) -> str:
    rate = t.notifications / t.hours if t.hours else math.nan
    top = ", ".join(f"{a} {n}" for a, n in t.alerts.most_common(3)) or "-"
    return (f"{name:<20}{t.runs:>5}{rate:>11.2f}{t.worst:>7}{t.slack:>7}{t.pagerduty:>5}"
            f"{t.flaps:>7}{t.false_critical:>7}  {top}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=7000, help="the first seed (default 7000)")
    parser.add_argument("--runs", type=int, default=3, help="runs per kind (default 3)")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--step-seconds", type=float, default=30.0,
                        help="the step period the records are timed at (default 30 s)")
    parser.add_argument("--flap-steps", type=int, default=20,
                        help="a re-fire within this many steps of a resolve is a flap")
    parser.add_argument("--kinds", default=",".join(KINDS), help="comma-separated subset")
    parser.add_argument("--json", action="store_true", help="also print one JSON line per kind")
    args = parser.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        parser.error(f"unknown kind {unknown[0]!r} (kinds: {', '.join(KINDS)})")
    seeds = range(args.seeds, args.seeds + args.runs)
    started = time.perf_counter()
    print(f"{len(kinds)} kinds x {args.runs} runs x {args.steps} steps at "
          f"{args.step_seconds:g} s a step ({args.steps * args.step_seconds / 3600:.2f} h a run), "
          f"seeds {seeds.start}-{seeds.stop - 1}; flap = re-fire within {args.flap_steps} steps")
    print(f"{'kind':<20}{'runs':>5}{'notif/h':>11}{'worst':>7}{'slack':>7}{'pd':>5}"
          f"{'flaps':>7}{'crit':>7}  most frequent firings")
    total = Tally()
    rates = []
    for kind in kinds:
        tally = run_kind(kind, seeds, args.steps, args.step_seconds, args.flap_steps)
        total.add(tally)
        rates.append(tally.notifications / tally.hours)
        print(_row(kind, tally), flush=True)
        if args.json:
            print(json.dumps({"kind": kind, "runs": tally.runs, "hours": tally.hours,
                              "notifications": tally.notifications, "slack": tally.slack,
                              "pagerduty": tally.pagerduty, "flaps": tally.flaps,
                              "false_critical": tally.false_critical, "held": tally.held,
                              "escalations": tally.escalations,
                              "firings": dict(tally.alerts)}))
    print(_row("all", total))
    print(f"notifications per run-hour: mean {total.notifications / total.hours:.2f}, "
          f"worst kind {max(rates):.2f}, median kind {statistics.median(rates):.2f}; "
          f"flaps {total.flaps}; false critical {total.false_critical} "
          f"({total.escalations} escalations); held over the per-hour bound {total.held}; "
          f"{time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
