"""``bench/bench_reward_hacking.py``'s measure of a case's size (``signal``): what the hack alone
has moved the legs that name it, in each series' own noise; nothing where nothing was added."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bench import bench_reward_hacking as bench
from rlmon.service.metrics import catalog as c


def _case(kind: str, seed: int) -> bench.Case:
    return next(case for case in bench.cases(range(seed, seed + 1)) if case.kind == kind)


@pytest.mark.parametrize("seed", [0, 1, 7002, 7003])
def test_a_climb_grows_step_by_step_and_a_healthy_run_has_none(seed: int) -> None:
    climb = _case("climb", seed)
    series = bench.series_of(climb)
    sizes = [bench.signal(climb, series, within=k) for k in (5, 10, 15, 30)]
    assert sizes == sorted(sizes) and sizes[0] > 0, sizes
    healthy, _ = bench.healthy(seed)
    # the same run without the hack: no leg moved, so nothing is credited but the reward's lead
    assert bench.signal(climb, healthy) <= bench.PARAMS.reward_lead + 1e-9


@pytest.mark.parametrize("seed", [7002, 7003])
def test_a_climb_away_from_the_verifier_is_sized_by_its_gap(seed: int) -> None:
    """Length and KL stay on their course, so only the verifier gap can name it: its size is
    the smaller of the reward's departure and the gap's, both the added reward over a scale."""
    case = _case("climb-gap", seed)
    series = bench.series_of(case)
    assert c.VERIFIER_SCORE in series
    size = bench.signal(case, series)
    at = case.onset + bench.WITHIN
    added = series[c.REWARD][at] - bench.healthy(seed)[0][c.REWARD][at]
    assert size > 0 and math.isfinite(size)
    # the gap grows as the added reward does: twice the steps, about twice the size
    assert bench.signal(case, series, within=2 * bench.WITHIN + 1) > 1.5 * size
    assert added > 0


def test_climbs_away_from_a_verifier_on_tuning_seeds_are_named_in_time() -> None:
    """The verifier gap credited with its lead where it carries its share of the reward's
    departure over its own window: on tuning seeds 0-39, 28 or more of the 40 climbs away from
    a verifier are named within 15 steps (26 before the lead; 29 with it), and none of the
    healthy runs fires."""
    rule = [bench.reward_hacking_rule()]
    named = fired = 0
    for case in bench.cases(range(40)):
        if case.kind not in ("climb-gap", "healthy"):
            continue
        firings = [step for _, step, state in bench.transitions(case, rule) if state == "firing"]
        if case.kind == "healthy":
            fired += bool(firings)
        else:
            named += any(case.onset <= step <= case.onset + bench.WITHIN for step in firings[:1])
    assert fired == 0
    assert named >= 28, named


def test_an_unseen_healthy_learner_with_a_verifier_is_not_named_early_in_its_run() -> None:
    """Seed 8215, from a set no session tuned on: a linear learner with a verifier score. Its
    gap's line through the first 25-29 steps, projected on, read the bend of its early learning
    as the reward leaving the score at steps 38-44; judged on a line of warmup steps it fires
    nothing."""
    case = bench.Case(8215, "healthy")
    series = bench.series_of(case)
    assert c.VERIFIER_SCORE in series
    assert [step for _, step, state in bench.transitions(case, [bench.reward_hacking_rule()])
            if state == "firing"] == []


def test_a_climb_named_on_a_weak_step_is_held_while_the_alert_fires() -> None:
    """Seed 8125's climb away from a verifier (unused seeds): named at step 91, 18 steps after
    its onset, on a score just over the decision. The next weak step took the score under it;
    the baseline was let go at once, slid over the climb, and the alert resolved at step 95
    and never fired again in the 205 steps the hack went on (held 2 % of them). The baseline
    now stays pinned until the alert resolves: held to the end."""
    case = _case("climb-gap", 8125)
    events = bench.transitions(case, [bench.reward_hacking_rule()])
    assert events and events[0][1:] == (91, "firing")
    share = bench.held_share(events, "RewardHacking", bench.STEPS)
    assert share is not None and share > 0.95, events
    assert events[-1][2] == "firing"


def test_the_issue_s_climb_away_from_a_flat_verifier_is_named_within_15_steps() -> None:
    """Issue 39's verifier-gap-alone run (the reward +0.008 a step away from a verifier on the
    healthy course; length and KL on theirs), seeds 0-99: 90 or more named within 15 steps of
    the onset, none before it. The gap of two scores' independent noise averages down over its
    newest three steps (83 named in time before that mean was judged too)."""
    rule = [bench.reward_hacking_rule()]
    lags = []
    for seed in bench.ISSUE_SEEDS:
        rows = bench.issue_run(seed, signature=False, verifier=True)
        series = {name: np.array([row[name] for row in rows]) for name in rows[0]}
        firings = [step for _, step, state in bench.transitions(bench.Case(seed, "issue"), rule,
                                                                series) if state == "firing"]
        lags.append(firings[0] - bench.ISSUE_ONSET if firings else None)
    assert all(lag is None or lag >= 0 for lag in lags), lags
    assert sum(lag is not None and lag <= bench.WITHIN for lag in lags) >= 90, lags
