"""Claims about alerts (``bench/claims_alerts.py``'s, scored case by case): reward hacking named
within 15 steps of its onset and never on a healthy run whose reward and length grow together;
an escalation quoting the critical level and the step it was first crossed, priced once; quiet
on healthy runs with benign changes (a warning there is a false claim).

Reward hacking and escalations run on the bench's seeds (its tuning seeds lie in the reward-
hacking detector's tuning set 0-199; its held-out seeds in none). The healthy runs are 400
steps of each of ``bench_hard_negatives.py``'s 15 kinds through ``rlmon replay``: the first 5
of the bench's seeds (its held-out 9100-9104 are ``claims_alerts.py``'s held-out set), one
seed of 300 steps with ``--fast``."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from bench.claims.registry import register
from bench.claims.score import Score

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/: its scripts import so
import claims_alerts

__all__ = ["escalation", "healthy_quiet", "reward_hacking"]

QUIET_RUNS = 5  # seeds of the healthy runs (15 kinds x 400 steps each)


def _seeds(seeds: Sequence[int]) -> range:
    return range(min(seeds), max(seeds) + 1)


@register("alert.reward_hacking", "RewardHacking named within 15 steps of the hack's onset "
          "(jumps, ramps, steady climbs, the verifier gap); never on a healthy run whose reward "
          "and length grow together, nor on a length runaway or KL blow-up alone")
def reward_hacking(seeds: Sequence[int], fast: bool) -> Score:
    score = Score("alert.reward_hacking")
    for case in claims_alerts.hacking_cases(_seeds(seeds)):
        if not case.hack:
            score.event(truth=False, said=case.fired, right=False,
                        what=f"{case.kind}: RewardHacking on a run without a hack")
            continue
        said = case.delay is not None or case.early
        right = case.delay is not None and case.delay <= claims_alerts.WITHIN and not case.early
        score.event(truth=True, said=said, right=right, delay=case.delay,
                    what=f"{case.kind}: " + ("fired before the onset" if case.early else
                                            f"named {case.delay} steps after the onset"))
    return score


@register("alert.escalation", "an escalated alert quotes the critical level and the step it was "
          "first crossed and is priced once (KL, gradient-norm blow-ups; an entropy collapse "
          "of more than 90 % of its own level is critical)")
def escalation(seeds: Sequence[int], fast: bool) -> Score:
    score = Score("alert.escalation")
    for case in claims_alerts.escalation_cases(_seeds(seeds)):
        score.event(truth=True, said=case.escalated,
                    right=case.escalated and case.quoted_right and case.priced_once,
                    what=f"{case.alert}: escalated {case.escalated}, quoted right "
                         f"{case.quoted_right}, priced once {case.priced_once}")
    return score


@register("alert.healthy_quiet", "nothing fires on healthy runs with benign changes (a "
          "curriculum switch, an LR restart, a fast learner, an async lag's jitter ...): each "
          "warning is a false claim; targets at most 1 per 1,000 healthy steps, at most 3 "
          "notifications of one condition in a run")
def healthy_quiet(seeds: Sequence[int], fast: bool) -> Score:
    score = Score("alert.healthy_quiet")
    runs = list(claims_alerts.healthy_runs(list(seeds)[:1 if fast else QUIET_RUNS],
                                           300 if fast else 400))
    for run in runs:  # a silent case per run, a false claim per warning
        score.event(truth=False, said=bool(run.warnings), right=False,
                    what=f"{run.kind}-{run.seed}: {run.warnings} warnings on a healthy run")
        score.stated += max(0, run.warnings - 1)
    score.notes = (f"{claims_alerts.per_1000(runs):.2f} warnings per 1,000 healthy steps "
                   f"({sum(r.steps for r in runs):,} steps), at most "
                   f"{max(r.worst for r in runs)} notifications of one condition in a run")
    return score
