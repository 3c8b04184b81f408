"""Reward hacking: the reward climbing with the completion length and the KL, or away from a score
the policy is not trained on.

A policy that found a loophole in the reward (padding, repeating the rubric's words, a format the
grader over-scores) shows it in the run's own curves before anyone reads a completion: the reward
climbs faster than it did, the completions get longer and the policy moves away from the reference
(the KL rises). Each alone is common in a healthy run (an "aha" stretch, a longer chain of thought,
a KL that grows from zero), and reward and length often rise together in a healthy run: what is
judged is each series' *departure* from its own earlier course, all three at once.

- **Baseline**: over the ``window`` steps that end ``guard`` steps before the newest (so a fresh
  departure is not yet part of it), a robust line per series (slopes from the medians of the two
  halves, as :mod:`rlmon.service.alerting.baseline`): the reward, the log of the response length
  and the log of the KL. Its scale is 1.4826 x the median absolute residual, floored (2% of
  length, 5% of KL, 2% of the reward's level) so a quiet run does not alarm on a small change.
  A run whose reward and length have grown together all along projects both lines on: that
  growth is not a departure.
- **Evidence**: each step's z-scores (departure / scale) of the reward, the length and the KL.
  The signature's evidence is the middle of the three once each is at least ``leg_floor`` out
  (else the smallest): all three out together, but one leg that its own noise hides (a high,
  noisy KL) does not veto two far out; the reward's is credited with ``reward_lead``. The
  length is judged against its own line, not against what the reward's departure "explains" at
  the run's past length-per-reward coupling: a hack is by definition the reward leaving its
  course, so that correction took out exactly the length a hack adds wherever the length had
  followed the reward (and, with the length's own drift read as coupling, more): 11 of 100
  held-out steady climbs were named late or never for it, and no healthy run of the benchmark
  needed it.
- **The verifier**: where a held-out or verifier score is logged (``rollout/verifier_score``),
  two things. If it keeps up with the reward (the reward-minus-verifier gap opened by less than
  ``verifier_share`` of the reward's departure) the signature counts nothing: a healthy
  take-off moves reward, length and KL together as a hack does, and the held-out score says
  which it is. And the gap is a witness of its own: the smaller of the reward's z (credited
  alike) and the gap's, when that is larger (the reward up while the held-out score does not
  follow), provided the gap carries ``verifier_share`` of the reward's departure measured over
  the gap's own window (like with like: a take-off opens the gap of a verifier on a slightly
  smaller scale by a fifth of its rise, and a few SDs of a quiet gap's noise). The gap's z is
  the larger of its newest step's and of its newest ``gap_mean_steps`` steps' mean departure
  over the robust spread of such means in its own baseline, credited at ``gap_mean_credit``:
  a gap of two scores' independent sampling noise averages down over a few steps, so a steady
  climb away from a flat verifier is named sooner (issue 39's run: 92 of 100 within 15 steps,
  83 on the newest step alone), while a gap that wanders with the policy does not, and the
  spread of its means says so. Each step's departure counts at most ``gap_mean_clip`` robust
  SDs in that mean, so three lucky batches are not carried into a fourth step's evidence.
  The gap's line ends ``gap_guard`` steps before the newest, further back
  than the others': the score shares the policy's wander, so the gap is steadier than any one
  series and its line can be carried further ahead, and a slow climb is kept out of it for
  longer. The gap is judged once that line has ``warmup`` steps, as the others' have from the
  first judged step.
- **CUSUM**: ``S = max(0, S + e - allowance)``, fires while ``S >= decision``; ``e`` is clipped
  so that no fewer than four steps fire (one lucky batch is a heavy-tailed sample, not a hack),
  and ``S`` is capped at 2 x ``decision`` so the warning resolves soon after the run settles.
- **Held while it lasts**: from the step ``S`` reaches the decision the baseline is *pinned*:
  the steps since are kept out of it and each new step is judged against the baseline's lines
  projected that many steps ahead. A hack that climbs for 80 steps at a steady rate (+0.008
  reward, +1.2 % length, +0.004 KL a step) would otherwise become the baseline's own trend
  within a window and the alert would resolve while the hack goes on. The pin is let go once
  the alert resolves (``S`` under the decision for the rule's ``resolve_after`` steps: the
  metrics are on their pre-onset course again) or after ``hold`` steps.
  Pinning before it fires was tried: it turned healthy take-offs into alarms (7-10 of 200 tuning
  runs). Naming a hack takes all three legs out (or the reward and the gap); holding it takes
  less: two legs out (an adaptive KL controller that reins the KL in does not end a hack whose
  reward and length climb on), or the gap still open (a dip of the skill both scores see can
  bring the reward back to its course while the hack goes on).

The state is plain numbers (the trailing rows and ``S``), kept in the engine's
:class:`~rlmon.service.alerting.engine.AlertState` and saved with it, so a restarted service and
``rlmon replay`` / ``rlmon diagnose`` continue exactly. It is judged within one stream: the role
that logs the reward, the length and the KL together (the framework integrations' driver or
trainer, a diagnosed log). Where the stream logs no KL (TRL with ``beta=0``, a rollout role),
the length leg is not judged (reward and length alone rise together too often in healthy runs);
the verifier gap still is.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

from rlmon.service.metrics import catalog as c

__all__ = ["ALERT", "SUMMARY", "WHAT_TO_CHECK", "Evidence", "RewardHackingParams", "observe",
           "robust_line"]

ALERT = "RewardHacking"
SUMMARY = ("Reward climbing off its course with completion length and KL (or away from its held-out / "
           "verifier score)")
WHAT_TO_CHECK = (
    "The reward may be hacked: read the highest-reward completions of the last steps "
    "(rollout/reward_highest) for padding, repetition, rubric words or a format the grader "
    "over-scores; compare the reward with a held-out or verifier score on the same prompts; "
    "penalise length or cap it, raise the KL coefficient, and fix the reward function before "
    "training on.")

_MAD_TO_SD = 1.4826
_TINY = 1e-12
_COLUMNS = 4  # per step: reward, log length, log KL, verifier score (NaN: not logged)


@dataclass(frozen=True, slots=True)
class RewardHackingParams:
    """The detector's parameters; tuned on ``bench/bench_reward_hacking.py``'s tuning seeds."""

    window: int = 40  # baseline steps
    guard: int = 5  # newest steps kept out of the baseline
    warmup: int = 30  # baseline steps needed before a step is judged
    allowance: float = 2.0  # robust SDs of joint evidence a step must exceed to count
    decision: float = 8.0
    # newest steps kept out of the reward-minus-verifier gap's line (see the module's docstring)
    gap_guard: int = 10
    # robust SDs the gap's departure is credited with when it carries its share of the reward's
    # (0.3 before the mean below was judged: with it, a lead fired more healthy runs)
    gap_lead: float = 0.0
    # the gap is also judged by the mean departure of its newest ``gap_mean_steps`` steps,
    # against the spread of such means over its own baseline (a gap of two scores' independent
    # noise averages down; one that wanders with the policy does not, and its spread says so),
    # credited at ``gap_mean_credit``: that spread is measured on a few independent means
    gap_mean_steps: int = 3
    gap_mean_credit: float = 0.8
    gap_mean_clip: float = 3.0  # robust SDs of one step's gap departure counted in that mean
    length_floor: float = 0.02  # log units: the length's scale is at least 2%
    kl_floor: float = 0.05  # log units: the KL's scale is at least 5%
    kl_offset: float = 1e-3  # log(KL + offset): a KL of 0 at the start is finite
    reward_floor: float = 0.02  # of the reward's level (and 1e-3 absolute)
    hold: int = 300  # steps a firing alert keeps the baseline pinned (its saved state: 4 floats a step)
    # robust SDs the reward's departure is credited with in the joint evidence: of the three
    # legs it moves least against its noise in a steady hack (+0.008 a step against 0.02)
    reward_lead: float = 1.0
    # robust SDs each leg of the signature must be out by before the middle one is the evidence
    leg_floor: float = 1.5
    # the share of the reward's departure a logged verifier score must leave open (the gap) for
    # the signature to count: a hack leaves ~1 (the score does not follow), a real gain ~0
    verifier_share: float = 0.5

    @property
    def keep(self) -> int:
        return self.window + max(self.guard, self.gap_guard)


@dataclass(frozen=True, slots=True)
class Evidence:
    """A step's departures (z-scores) and what they are in the metrics' units."""

    evidence: float
    z_reward: float
    z_length: float
    z_kl: float
    z_gap: float
    reward_above: float  # reward minus its baseline line
    length_ratio: float  # length over its baseline line
    kl_ratio: float  # KL over its baseline line
    gap_above: float  # reward-minus-verifier gap over its baseline line

    def describe(self) -> str:
        parts = [f"reward {self.reward_above:+.3g} above its trend (z {self.z_reward:.1f})"]
        if math.isfinite(self.length_ratio):
            parts.append(f"response length x{self.length_ratio:.3g} of its trend "
                         f"(z {self.z_length:.1f})")
        if math.isfinite(self.kl_ratio):
            parts.append(f"KL x{self.kl_ratio:.3g} of its trend (z {self.z_kl:.1f})")
        if math.isfinite(self.gap_above):
            parts.append(f"reward - verifier gap {self.gap_above:+.3g} above its trend "
                         f"(z {self.z_gap:.1f})")
        else:  # the signature alone cannot tell a hack from a real take-off: say so
            parts.append("no verifier score logged (rollout/verifier_score) to tell a hack "
                         "from a healthy take-off, which moves these together too")
        return "; ".join(parts)


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    mid = n // 2
    return ordered[mid] if n % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])


def robust_line(values: list[float], ahead: int) -> tuple[float, float, float, float]:
    """(value expected ``ahead`` steps after the last, slope per step, robust scale, level)
    of a robust line through ``values`` (the NaN-free ones, in order)."""
    n = len(values)
    half = n // 2
    slope = (_median(values[n - half:]) - _median(values[:half])) / (n - half)
    centre = (n - 1) / 2
    detrended = [v - slope * (i - centre) for i, v in enumerate(values)]
    level = _median(detrended)
    mad = _median([abs(d - level) for d in detrended])
    return level + slope * (n - 1 + ahead - centre), slope, _MAD_TO_SD * mad, level


def mean_departure_z(base: list[float], slope: float, level: float, recent: list[float],
                     ahead: int, floor: float, clip: float) -> float:
    """The mean departure of ``recent`` (the newest steps, the last ``ahead`` steps after the
    end of ``base``) from the robust line through ``base`` (its ``slope`` and ``level``, as
    :func:`robust_line` fits them), each clipped at ``clip``, over the robust spread of the
    means of as many consecutive steps of ``base``'s own residuals (floored at ``floor``)."""
    n, m = len(base), len(recent)
    centre = (n - 1) / 2
    residuals = [v - (level + slope * (i - centre)) for i, v in enumerate(base)]
    means = [sum(residuals[i:i + m]) / m for i in range(n - m + 1)]
    middle = _median(means)
    spread = _MAD_TO_SD * _median([abs(x - middle) for x in means])
    last = n - 1 + ahead  # the newest step's position on the line
    departure = sum(min(max(v - (level + slope * (last - (m - 1 - j) - centre)), -clip), clip)
                    for j, v in enumerate(recent)) / m
    return departure / max(spread, floor)


def _column(rows: list[float], index: int) -> list[float]:
    return rows[index::_COLUMNS]


def _finite(values: list[float]) -> bool:
    return all(math.isfinite(v) for v in values)


def _baseline(p: RewardHackingParams, rows: list[float], guard: int
              ) -> tuple[list[float], int]:
    """The baseline rows (flat) that end ``guard`` steps before the newest kept step, at most
    ``window`` of them, and how many steps ahead of their last the new step lies."""
    n = len(rows) // _COLUMNS
    end = min(n, p.keep) - guard
    return rows[max(0, end - p.window) * _COLUMNS:end * _COLUMNS], n - end + 1


def _evidence(p: RewardHackingParams, rows: list[float], new: tuple[float, ...],
              holding: bool) -> Evidence | None:
    """The new step's evidence against the baseline ``rows`` (flat, oldest first): ``window``
    of them (fewer while warming up) ending ``guard`` steps before the newest (``gap_guard`` for
    the verifier gap); rows beyond ``keep`` are the steps of a departure, kept while the
    baseline is pinned. ``holding``: the alert fires; two legs of the signature out, or the
    verifier gap open, keep it firing."""
    base, ahead = _baseline(p, rows, p.guard)
    rewards, lengths, kls = _column(base, 0), _column(base, 1), _column(base, 2)
    if not (_finite(rewards) and _finite(lengths)):
        return None
    exp_r, _, sd_r, level_r = robust_line(rewards, ahead)
    reward_floor = max(p.reward_floor * abs(level_r), 1e-3)
    exp_l, _, sd_l, _ = robust_line(lengths, ahead)
    reward, length, kl, verifier = new
    reward_above = reward - exp_r
    z_r = reward_above / max(sd_r, reward_floor)
    z_l = (length - exp_l) / max(sd_l, p.length_floor)
    # without the KL (a stream that does not log it) the length leg is not judged: reward and
    # length alone rise together too often in healthy runs
    z_k = -math.inf
    kl_ratio = math.nan
    if math.isfinite(kl) and _finite(kls):
        exp_k, _, sd_k, _ = robust_line(kls, ahead)
        z_k = (kl - exp_k) / max(sd_k, p.kl_floor, _TINY)
        kl_ratio = math.exp(kl - exp_k)
    z_g = gap_above = reward_above_g = math.nan
    if math.isfinite(verifier):
        base_g, ahead_g = _baseline(p, rows, p.gap_guard)
        verifiers = _column(base_g, 3)
        # the gap's line ends further back, so early in a run it would be drawn through fewer
        # steps than the others' (25 at the first judged step), while the learning curve bends
        # most: judged once it has ``warmup`` steps of its own
        if len(verifiers) >= min(p.warmup, p.window) and _finite(verifiers):
            rewards_g = _column(base_g, 0)
            gaps = [r - v for r, v in zip(rewards_g, verifiers, strict=True)]
            exp_g, slope_g, sd_g, level_g = robust_line(gaps, ahead_g)
            gap_above = (reward - verifier) - exp_g
            z_g = gap_above / max(sd_g, reward_floor)
            m = p.gap_mean_steps
            tail = rows[max(0, len(rows) - (m - 1) * _COLUMNS):] if m > 1 else []
            newest = [r - v for r, v in zip(_column(tail, 0), _column(tail, 3), strict=True)] \
                + [reward - verifier]
            if m > 1 and _finite(newest) and len(newest) == m:
                # one step's luck counts at most ``gap_mean_clip`` SDs in the mean, so a burst of
                # three lucky batches is not carried into a fourth step's evidence
                z_g = max(z_g, p.gap_mean_credit * mean_departure_z(
                    gaps, slope_g, level_g, newest, ahead_g, reward_floor / math.sqrt(m),
                    p.gap_mean_clip * max(sd_g, reward_floor)))
            # the reward's own departure over the gap's window: what the gap's share is of
            reward_above_g = reward - robust_line(rewards_g, ahead_g)[0]
    # the signature: all three legs out together, each by at least ``leg_floor``, judged by the
    # middle one, so one leg that its own noise hides does not veto two far out
    low, middle, _ = sorted((z_r + p.reward_lead, z_l, z_k))
    evidence = middle if low >= p.leg_floor or holding else low
    if math.isfinite(z_g):
        # ... unless the logged verifier score keeps up with the reward: then the gain is real
        # (a healthy take-off moves reward, length and KL together as a hack does)
        if gap_above < p.verifier_share * reward_above:
            evidence = min(evidence, 0.0)
        # the verifier gap alone: the reward up, the held-out score not, the gap carrying its
        # share of the reward's departure over the same window (a healthy take-off opens the
        # gap of a verifier on a slightly smaller scale by a fifth of it); once named, the gap
        # still open holds it (a dip of the skill both scores see can bring the reward back
        # to its course while the hack goes on)
        gap_leg = z_g
        if not holding:
            gap_leg = z_g + p.gap_lead
            if gap_above < p.verifier_share * reward_above_g:
                gap_leg = min(gap_leg, 0.0)
            gap_leg = min(z_r + p.reward_lead, gap_leg)
        evidence = max(evidence, gap_leg)
    return Evidence(evidence, z_r, z_l, z_k, z_g, reward_above, math.exp(length - exp_l),
                    kl_ratio, gap_above)


def row(params: RewardHackingParams, metrics: Mapping[str, float]) -> tuple[float, ...] | None:
    """The step's values as the detector keeps them; None where the reward or the length is
    missing or not finite (the step is not judged)."""
    reward = metrics.get(c.REWARD)
    length = metrics.get(c.RESPONSE_LENGTH)
    if reward is None or length is None or not math.isfinite(reward) \
            or not math.isfinite(length) or length <= 0:
        return None
    kl = metrics.get(c.KL, math.nan)
    log_kl = math.log(max(kl, 0.0) + params.kl_offset) if math.isfinite(kl) else math.nan
    verifier = metrics.get(c.VERIFIER_SCORE, math.nan)
    return reward, math.log(length), log_kl, verifier if math.isfinite(verifier) else math.nan


def observe(params: RewardHackingParams, history: deque[float], score: float,
            metrics: Mapping[str, float], firing: bool = False) -> tuple[float, Evidence | None]:
    """Judge the step's ``metrics`` against ``history`` (the trailing rows, flat), append them,
    and return the new CUSUM score (the condition holds while it is >= ``decision``) and the
    step's evidence (None: not judged). ``firing``: the alert has fired and not yet resolved
    (its rule resolves a few steps after the score falls under the decision)."""
    new = row(params, metrics)
    if new is None:
        return score, None
    found = None
    # pinned, and held by two legs or the gap, from the step the score reaches the decision
    # until the alert resolves: one weak step of a hack that goes on takes the score under the
    # decision, and a baseline let go then slid over the climb, which was never named again
    pinned = firing or score >= params.decision
    if len(history) // _COLUMNS >= min(params.warmup, params.window) + params.guard:
        found = _evidence(params, list(history), new, pinned)
        if found is not None:
            cap = params.allowance + params.decision / 4  # four steps at the cap fire
            e = min(max(found.evidence, -cap), cap)
            score = min(max(0.0, score + e - params.allowance), 2 * params.decision)
    history.extend(new)
    # the departure kept out of the baseline for at most ``hold`` steps; else the window slides
    limit = params.keep + (params.hold if firing or score >= params.decision else 0)
    while len(history) > limit * _COLUMNS:
        for _ in range(_COLUMNS):
            history.popleft()
    return score, found
