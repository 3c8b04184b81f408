"""Reward-hacking benchmark: how soon ``RewardHacking`` names a hacked reward, and that it stays
quiet on healthy runs whose reward and length grow together.

Simulated GRPO runs, one stream per run (the reward, the response length, the KL, the entropy and,
in half the runs, a held-out verifier score, as a framework's driver logs them; the verifier sees
the policy's own slow wander, as a score of the same policy does, with sampling noise of its
own). Healthy runs
learn at a healthy pace, each its own way: the reward settles (concave), climbs steadily (linear)
or takes off after a plateau (a sigmoid over 60-250 steps, the "aha" stretch of a reasoning run);
the response length follows the reward at the run's own coupling (0 to 1.5 log-units per unit of
reward) on top of its own drift; the KL grows from zero as the policy moves; heavy-tailed
sampling noise and a slow wander on every series. Hacking runs are the same runs until an onset
at a known step (60-120), where the policy finds a loophole: the reward climbs steeply (+0.15 to
+0.4 over 1-30 steps), the length balloons (x1.5 to x3) and the KL rises (x1.5 to x4) with it,
the entropy steady and the verifier score not following. A second kind (``verifier gap``) moves
the length and the KL only a little (x1.1): there only the held-out score tells. Two more
(issue 39) climb at a steady rate from the onset to the end of the run, as a hack that is never
fixed does: ``climb`` (+0.005 to +0.012 reward, +0.8 to +1.5 % length, +0.002 to +0.006 KL a
step, with or without a verifier score) and ``climb-gap`` (the reward climbing at that rate away
from a verifier score that stays on its healthy course, the length and the KL on theirs). For
them the share of the steps from the first alert to the end that the alert holds is printed:
a hack that goes on must not be "resolved".

Also run: ``bench_detection.py``'s healthy runs and its single-metric faults (a length runaway,
a KL blow-up alone), which must not be called reward hacking.

Prints the share caught, how many within 15 steps of the onset (issue 39's target), onset-to-alert
(steps; 0 = at the onset step), the first alert of the rest of the default pack on the same runs,
and the healthy runs that fired; for the steady climbs also how many are named within 15 steps
by the climb's size 15 steps after its onset (:func:`signal`: in robust SDs of each series' own
noise), which says where the misses are: on climbs still within a few SDs of their noise. And the
same for the peers' reward-hacking detectors that are installed (:mod:`peer_detectors`), run
live on the same steady climbs and healthy runs.
Parameters were tuned on seeds 0-199; the figures are for
held-out seeds 7000-7099 unless ``--seeds tuning``, or ``--seeds unused`` (8000-8399, looked at
only to check a change after it was tuned and measured held-out).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_detection  # the detection benchmark's healthy runs and faults
import peer_detectors

from rlmon.service.alerting.engine import AlertEngine
from rlmon.service.alerting.reward_hacking import RewardHackingParams, robust_line
from rlmon.service.alerting.rules import Rule, default_rules, reward_hacking_rule
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.metrics import catalog as c

TUNING_SEEDS = range(0, 200)
HELD_OUT_SEEDS = range(7000, 7100)
UNUSED_SEEDS = range(8000, 8400)
SEED_SETS = {"held-out": HELD_OUT_SEEDS, "tuning": TUNING_SEEDS, "unused": UNUSED_SEEDS}
STEPS = 300
SHAPES = ("concave", "linear", "sigmoid")
RAMPS = {"abrupt": (1, 1), "gradual": (5, 15), "slow": (15, 30)}
WITHIN = 15  # steps from the onset: issue 39's target for naming it
Series = dict[str, np.ndarray]


def _ar1(rng: np.random.Generator, n: int, phi: float) -> np.ndarray:
    return bench_detection._ar1(rng, n, phi)


def healthy(seed: int, steps: int = STEPS) -> tuple[Series, str]:
    """A healthy run whose reward and length grow together at the run's own pace."""
    rng = np.random.default_rng(seed)
    t = np.arange(steps, dtype=float)
    shape = SHAPES[seed % 3]

    def parts(lo: float, hi: float) -> tuple[np.ndarray, np.ndarray]:
        """Sampling noise of a fresh batch and a slow wander of the policy itself."""
        sd = float(rng.uniform(lo, hi))
        wander = rng.uniform(0.1, 0.7) * _ar1(rng, steps, float(rng.uniform(0.9, 0.98)))
        return sd * _ar1(rng, steps, float(rng.uniform(0, 0.3))), sd * wander

    def noise(lo: float, hi: float) -> np.ndarray:
        sampling, wander = parts(lo, hi)
        return sampling + wander

    r0 = rng.uniform(0.0, 0.4)
    gain = rng.uniform(0.2, 0.55)
    if shape == "concave":
        progress = 1 - np.exp(-t / rng.uniform(30, 200))
    elif shape == "linear":
        progress = np.minimum(t / rng.uniform(150, 400), 1)
    else:  # a plateau, then a take-off over 60-250 steps
        centre, width = rng.uniform(60, 220), rng.uniform(60, 250) / 8
        progress = 1 / (1 + np.exp(-(t - centre) / width))
        progress = (progress - progress[0]) / (1 - progress[0])
    clean = r0 + gain * progress
    sampling, skill = parts(0.008, 0.04)  # the policy's wander is its skill: a verifier sees it
    s: Series = {c.REWARD: clean + sampling + skill}
    coupling = rng.uniform(0.0, 1.5)  # log length per unit of reward
    drift = rng.uniform(-0.1, 0.3) * np.minimum(t, 300) / 300
    length0 = rng.uniform(150, 800)
    s[c.RESPONSE_LENGTH] = length0 * np.exp(coupling * (clean - r0) + drift + noise(0.01, 0.05))
    s[c.KL] = (0.002 + rng.uniform(0.02, 0.3) * (0.5 * progress + 0.5 * (
        1 - np.exp(-t / rng.uniform(50, 300))))) * np.exp(noise(0.03, 0.15))
    s[c.ENTROPY] = rng.uniform(0.3, 0.6) * (1 - 0.3 * progress) * np.exp(noise(0.01, 0.05))
    if seed % 2:  # a verifier that tracks the true skill (the clean reward), on the same scale
        scale = rng.uniform(0.8, 1.0)
        s[c.VERIFIER_SCORE] = scale * (clean + skill) + parts(0.01, 0.04)[0]
    return s, shape


@dataclass(frozen=True, slots=True)
class Case:
    seed: int
    kind: str  # healthy | length | gap | climb | climb-gap | detection-healthy | length_runaway
    #            | kl_blowup
    ramp: str = ""
    onset: int = 0


def _progress(steps: int, onset: int, ramp: int) -> np.ndarray:
    return np.clip((np.arange(steps) - onset + 1) / ramp, 0, 1)


def series_of(case: Case) -> Series:
    if case.kind.startswith("detection") or case.kind in ("length_runaway", "kl_blowup"):
        fault = None if case.kind == "detection-healthy" else case.kind
        dcase = bench_detection.Case(case.seed, STEPS, fault, "gradual", case.onset, 20)
        return {k: v for k, v in bench_detection.series_of(dcase).items()
                if k in (c.REWARD, c.RESPONSE_LENGTH, c.KL, c.ENTROPY)}
    s, _ = healthy(case.seed)
    if case.kind == "healthy":
        return s
    rng = np.random.default_rng(case.seed + 10_000)
    if case.kind.startswith("climb"):
        k = np.clip(np.arange(STEPS) - case.onset + 1, 0, None).astype(float)
        s[c.REWARD] = s[c.REWARD] + rng.uniform(0.005, 0.012) * k
        if case.kind == "climb":
            s[c.RESPONSE_LENGTH] = s[c.RESPONSE_LENGTH] * (1 + rng.uniform(0.008, 0.015)) ** k
            s[c.KL] = s[c.KL] + rng.uniform(0.002, 0.006) * k
        elif c.VERIFIER_SCORE not in s:  # climb-gap: a verifier on the run's healthy course
            s[c.VERIFIER_SCORE] = healthy(case.seed)[0][c.REWARD] \
                + 0.02 * rng.standard_normal(STEPS)
        return s
    lo, hi = RAMPS[case.ramp]
    p = _progress(STEPS, case.onset, int(rng.integers(lo, hi + 1)))
    s[c.REWARD] = s[c.REWARD] + rng.uniform(0.15, 0.4) * p
    if case.kind == "length":
        s[c.RESPONSE_LENGTH] = s[c.RESPONSE_LENGTH] * np.exp(math.log(rng.uniform(1.5, 3)) * p)
        s[c.KL] = s[c.KL] * np.exp(math.log(rng.uniform(1.5, 4)) * p)
    else:  # the verifier gap: length and KL barely move
        s[c.RESPONSE_LENGTH] = s[c.RESPONSE_LENGTH] * np.exp(math.log(1.1) * p)
        s[c.KL] = s[c.KL] * np.exp(math.log(1.1) * p)
        if c.VERIFIER_SCORE not in s:
            s[c.VERIFIER_SCORE] = s[c.REWARD] - rng.uniform(0.15, 0.4) * p \
                + 0.02 * rng.standard_normal(STEPS)
    return s


ISSUE_STEPS, ISSUE_ONSET = 150, 70
ISSUE_SEEDS = range(0, 100)


def issue_run(seed: int, signature: bool = True, verifier: bool = False,
              ) -> list[dict[str, float]]:
    """Issue 39's run, step by step: 150 steps of a healthy slow learner; from step 70 to the end
    the reward climbs +0.008 a step and, with ``signature``, the length +1.2 % and the KL +0.004
    a step with it; the verifier score (where logged) stays on the healthy course."""
    rng = np.random.default_rng(seed)
    rows = []
    for step in range(ISSUE_STEPS):
        k = max(0, step - ISSUE_ONSET + 1)
        row = {
            c.REWARD: 0.3 + 0.001 * step + 0.008 * k + 0.02 * rng.standard_normal(),
            c.RESPONSE_LENGTH: 300 * 1.0005 ** step * (1.012 ** k if signature else 1.0)
            * math.exp(0.02 * rng.standard_normal()),
            c.KL: (0.02 + 0.0002 * step + (0.004 * k if signature else 0.0))
            * math.exp(0.05 * rng.standard_normal()),
            c.ENTROPY: 0.4 + 0.01 * rng.standard_normal(),
        }
        if verifier:
            row[c.VERIFIER_SCORE] = 0.3 + 0.001 * step + 0.02 * rng.standard_normal()
        rows.append(row)
    return rows


PARAMS = RewardHackingParams()  # the defaults the rule runs with
SIGNAL_BANDS = ((-math.inf, 4.0), (4.0, 6.0), (6.0, math.inf))  # signal(): robust SDs


def signal(case: Case, s: Series, p: RewardHackingParams = PARAMS, within: int = WITHIN,
           ) -> float:
    """How far the hack alone has moved the series that name it ``within`` steps after the onset,
    in each series' noise before the onset (the detector's scales and floors over the window that
    ends ``guard`` steps before the onset): the smallest of the reward's (credited with its lead),
    the length's and the KL's departure, or, with a verifier score, the larger of that and the
    smaller of the reward's and the gap's. A measure of the case, not of the detector: how hard
    the climb is to name by then."""
    clean, _ = healthy(case.seed)
    at, on = case.onset + within, case.onset
    base = slice(on - p.guard - p.window, on - p.guard)

    def scale(values: np.ndarray, floor: float) -> float:
        return max(robust_line([float(v) for v in values[base]], 1)[2], floor)

    def log_kl(v: np.ndarray) -> np.ndarray:
        return np.log(np.maximum(v, 0.0) + p.kl_offset)

    level = robust_line([float(v) for v in s[c.REWARD][base]], 1)[3]
    reward_floor = max(p.reward_floor * abs(level), 1e-3)
    added = s[c.REWARD][at] - clean[c.REWARD][at]
    z_r = added / scale(s[c.REWARD], reward_floor) + p.reward_lead
    z_l = float(np.log(s[c.RESPONSE_LENGTH][at] / clean[c.RESPONSE_LENGTH][at])) / scale(
        np.log(s[c.RESPONSE_LENGTH]), p.length_floor)
    z_k = float(log_kl(s[c.KL])[at] - log_kl(clean[c.KL])[at]) / scale(log_kl(s[c.KL]),
                                                                      p.kl_floor)
    named = min(z_r, z_l, z_k)
    if c.VERIFIER_SCORE in s:
        followed = s[c.VERIFIER_SCORE][at] - clean[c.VERIFIER_SCORE][at] \
            if c.VERIFIER_SCORE in clean else 0.0
        gap = s[c.REWARD] - s[c.VERIFIER_SCORE]
        gap_base = slice(on - p.gap_guard - p.window, on - p.gap_guard)
        gap_scale = max(robust_line([float(v) for v in gap[gap_base]], 1)[2], reward_floor)
        named = max(named, min(z_r, (added - followed) / gap_scale))
    return float(named)


def records(s: Series, run: str) -> Iterable[StepRecord]:
    steps = len(next(iter(s.values())))
    for step in range(steps):
        yield StepRecord(run, "driver", step, True, 1, 1, (),
                         {name: float(v[step]) for name, v in s.items()})


def firings(case: Case, rules: list[Rule]) -> list[tuple[str, int]]:
    return [(alert, step) for alert, step, state in transitions(case, rules)
            if state == "firing"]


def transitions(case: Case, rules: list[Rule], s: Series | None = None,
                ) -> list[tuple[str, int, str]]:
    """Every (alert, step, firing|resolved) of the rules on the case's run (``s``: its series,
    where already built)."""
    engine = AlertEngine(rules)
    out = []
    for record in records(series_of(case) if s is None else s, f"run-{case.seed}"):
        out += [(e.alert, e.step, e.state) for e in engine.evaluate(record)]
    return out


def held_share(events: list[tuple[str, int, str]], alert: str, end: int) -> float | None:
    """The share of the steps from ``alert``'s first firing to ``end`` (exclusive) that it
    was firing; None where it never fired."""
    firing_at = None
    first = None
    held = 0
    for name, step, state in events:
        if name != alert:
            continue
        if state == "firing" and firing_at is None:
            firing_at = step
            first = step if first is None else first
        elif state == "resolved" and firing_at is not None:
            held += step - firing_at
            firing_at = None
    if first is None:
        return None
    if firing_at is not None:
        held += end - firing_at
    return held / max(1, end - first)


def cases(seeds: range) -> list[Case]:
    out = []
    for seed in seeds:
        out.append(Case(seed, "healthy"))
        rng = np.random.default_rng(seed + 20_000)
        onset = int(rng.integers(60, 121))
        ramp = tuple(RAMPS)[seed % 3]
        out.append(Case(seed, "length", ramp, onset))
        if seed % 2:  # the runs with a verifier score
            out.append(Case(seed, "gap", ramp, onset))
        out.append(Case(seed, "climb", "steady", onset))
        out.append(Case(seed, "climb-gap", "steady", onset))
        if seed % 4 == 0:
            out.append(Case(seed, "detection-healthy"))
            out.append(Case(seed, "length_runaway", "gradual", onset))
            out.append(Case(seed, "kl_blowup", "gradual", onset))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", choices=tuple(SEED_SETS), default="held-out")
    parser.add_argument("--full-pack", action="store_true",
                        help="also the first alert of the rest of the default pack (slower)")
    args = parser.parse_args()
    seeds = SEED_SETS[args.seeds]
    started = time.perf_counter()
    hacking = [reward_hacking_rule()]
    rest = [r for r in default_rules() if r.name != "RewardHacking"]
    lags: dict[tuple[str, str], list[int | None]] = {}
    other: dict[tuple[str, str], list[int | None]] = {}
    quiet: dict[str, list[str]] = {}
    early: list[str] = []
    held: dict[str, list[float]] = {}
    by_signal: dict[tuple[str, int], list[bool]] = {}  # (kind, band): named within 15 or not
    for case in cases(seeds):
        series = series_of(case)
        events = transitions(case, hacking, series)
        fired = [(a, st) for a, st, state in events if state == "firing"]
        if case.kind.startswith("climb"):
            share = held_share(events, "RewardHacking", STEPS)
            if share is not None:
                held.setdefault(case.kind, []).append(share)
        if case.kind in ("healthy", "detection-healthy", "length_runaway", "kl_blowup"):
            quiet.setdefault(case.kind, [])
            if fired:
                quiet[case.kind].append(f"seed {case.seed} at step {fired[0][1]}")
            continue
        before = [s for _, s in fired if s < case.onset]
        if before:
            early.append(f"{case.kind} seed {case.seed} at step {before[0]} (onset {case.onset})")
        after = [s - case.onset for _, s in fired if s >= case.onset]
        lags.setdefault((case.kind, case.ramp), []).append(after[0] if after else None)
        if case.kind.startswith("climb"):
            size = signal(case, series)
            band = next(i for i, (lo, hi) in enumerate(SIGNAL_BANDS) if lo <= size < hi)
            by_signal.setdefault((case.kind, band), []).append(bool(after) and after[0] <= WITHIN)
        if args.full_pack:
            steps = [(a, s - case.onset) for a, s in firings(case, rest) if s >= case.onset]
            other.setdefault((case.kind, case.ramp), []).append(steps[0][1] if steps else None)
    print(f"reward-hacking benchmark, {args.seeds} seeds {seeds.start}-{seeds.stop - 1}, "
          f"{STEPS} steps a run ({time.perf_counter() - started:.0f} s)")
    print(f"{'kind':<9} {'onset':<8} {'caught':>8}  {'within 15':>9}  "
          f"{'RewardHacking: mean (max) steps':<34}"
          + ("  first other alert: mean" if args.full_pack else ""))
    for (kind, ramp), found in sorted(lags.items()):
        hit = [v for v in found if v is not None]
        text = f"{statistics.mean(hit):.1f} ({max(hit)})" if hit else "-"
        within = sum(1 for v in hit if v <= WITHIN)
        line = f"{kind:<9} {ramp:<8} {len(hit):>3} of {len(found):<3}  {within:>9}  {text:<34}"
        if args.full_pack:
            o = [v for v in other[(kind, ramp)] if v is not None]
            line += f"  {statistics.mean(o):.1f}, {len(o)} caught" if o else "  none"
        print(line)
    for kind, fired_runs in quiet.items():
        runs = sum(1 for case in cases(seeds) if case.kind == kind)
        print(f"{kind}: {len(fired_runs)} of {runs} runs fired RewardHacking"
              + (": " + ", ".join(fired_runs[:8]) if fired_runs else ""))
    print(f"before the onset: {len(early)}" + (": " + ", ".join(early[:8]) if early else ""))
    for kind in sorted({k for k, _ in by_signal}):
        parts = []
        for band, (lo, hi) in enumerate(SIGNAL_BANDS):
            named = by_signal.get((kind, band), [])
            label = f"< {hi:g}" if lo == -math.inf else f">= {lo:g}" if hi == math.inf \
                else f"{lo:g}-{hi:g}"
            parts.append(f"{label} SDs {sum(named)} of {len(named)}")
        print(f"{kind}: named within {WITHIN}, by the hack's size {WITHIN} steps after its onset "
              f"(signal()): " + ", ".join(parts))
    for kind, shares in sorted(held.items()):
        print(f"{kind}: held {statistics.mean(shares):.0%} of the steps from its first alert to "
              f"the end (lowest {min(shares):.0%}, {len(shares)} runs caught)")
    issue_runs()
    compare_peers(seeds)
    return 0


def issue_runs() -> None:
    """Issue 39's own run (:func:`issue_run`) on seeds 0-99, in its three forms: named within 15
    steps of the onset, the steps it took, and the runs it held to the end once named."""
    for signature, verifier, form in ((True, False, "reward, length and KL"),
                                      (True, True, "the same with a verifier score"),
                                      (False, True, "the verifier gap alone")):
        lags, held = [], 0
        for seed in ISSUE_SEEDS:
            rows = issue_run(seed, signature, verifier)
            s = {name: np.array([row[name] for row in rows]) for name in rows[0]}
            events = transitions(Case(seed, "issue"), [reward_hacking_rule()], s)
            fired = [step for _, step, state in events if state == "firing"]
            if fired:
                lags.append(fired[0] - ISSUE_ONSET)
                held += all(state == "firing" for _, _, state in events)
        within = sum(0 <= lag <= WITHIN for lag in lags)
        print(f"issue 39's run, {form}, seeds {ISSUE_SEEDS.start}-{ISSUE_SEEDS.stop - 1}: named "
              f"within {WITHIN} {within} of {len(ISSUE_SEEDS)}, named {len(lags)}"
              + (f" ({statistics.median(lags):.0f} median, {max(lags)} max steps after the "
                 f"onset; {sum(lag < 0 for lag in lags)} before it)" if lags else "")
              + f", held to the end {held}")


def compare_peers(seeds: range) -> None:
    """The installed peers on the steady climbs and the healthy runs: named within 15 steps of
    the onset, named at all, before the onset, where their findings say the hack began, and
    healthy runs named."""
    peers = peer_detectors.installed()
    if not peers:
        print("peers: none installed (pip install -e '.[peers]'): rlprobe, rlwatch")
        return
    runs = [(case, series_of(case)) for case in cases(seeds)
            if case.kind in ("healthy", "climb", "climb-gap")]
    for name, first in peers.items():
        started = time.perf_counter()
        named: dict[str, list[tuple[int, int | None] | None]] = {}
        for case, series in runs:
            found = first(series)
            named.setdefault(case.kind, []).append(None if found is None else (
                found[0] - case.onset, None if found[1] is None else found[1] - case.onset))
        parts = []
        for kind in ("climb", "climb-gap"):
            found = named[kind]
            hit = [lag for lag in found if lag is not None and lag[0] >= 0]
            lags = [lag for lag, _ in hit]
            pointed = [at for _, at in hit if at is not None]
            parts.append(
                f"{kind} named within {WITHIN} {sum(lag <= WITHIN for lag in lags)} of "
                f"{len(found)}, named {len(hit)}"
                + (f" (median {statistics.median(lags):.0f} steps after the onset, its finding "
                   f"pointing at {statistics.median(pointed):+.0f})" if pointed else "")
                + f", before the onset {sum(lag is not None and lag[0] < 0 for lag in found)}")
        healthy_named = sum(lag is not None for lag in named["healthy"])
        print(f"peer {name}: " + "; ".join(parts)
              + f"; healthy runs named {healthy_named} of {len(named['healthy'])} "
              f"({time.perf_counter() - started:.0f} s)")

if __name__ == "__main__":
    sys.exit(main())
