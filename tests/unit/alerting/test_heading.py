"""A firing early warning states where its metric is heading as soon as it can, not only at
the firing (issue 39, :mod:`rlmon.service.alerting.heading`): an entropy sliding geometrically
fires with too few departure values to calibrate a range on; a few steps later the alert states
its range (an update, not a new incident), the range holds the real crossing, and it is not
stated again while it holds."""

from __future__ import annotations

import math
import random

from rlmon.service.alerting import heading
from rlmon.service.alerting.engine import AlertEngine
from rlmon.service.alerting.rules import default_rules
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.diagnose.findings import diagnose
from rlmon.service.diagnose.logged_run import LoggedRun


def _entropy(step: int, rng: random.Random) -> float:
    if step < 150:
        return 0.5 * math.exp(0.02 * rng.gauss(0, 1))
    return 0.5 * 0.5 ** ((step - 150) / 12) * math.exp(0.02 * rng.gauss(0, 1))


def test_the_heading_is_stated_while_the_alert_holds_and_holds() -> None:
    engine = AlertEngine(default_rules())
    rng = random.Random(4)
    values = [_entropy(step, rng) for step in range(260)]
    events = []
    for step, value in enumerate(values):
        events += [e for e in engine.evaluate(StepRecord(
            "r", "actor", step, True, 1, 1, (), {"actor/entropy": value}))
            if e.alert == "EntropySliding"]
    firing = [e for e in events if e.state == "firing" and not e.repeat]
    updates = [e for e in events if e.repeat]
    assert firing and "reaches" not in firing[0].detail  # too few values as it fired
    assert len(updates) == 1, [(e.step, e.detail) for e in updates]
    update = updates[0]
    assert firing[0].step < update.step <= firing[0].step + heading.DENSE
    assert "where it is heading now" in update.summary
    assert update.detail.startswith("actor/entropy reaches EntropyCollapse's level (0.01)")
    earliest, latest = (float(x) for x in update.detail.split("90% range ")[1].split(" ")[0]
                        .split("-"))
    crossed = next(s for s, v in enumerate(values) if s > update.step and v <= 0.01)
    assert earliest <= crossed - update.step <= latest, update.detail


def test_refreshes_are_few_on_a_long_incident() -> None:
    """Every step for the first few after the firing, then ever further apart."""
    due = [age for age in range(1, 1000) if heading._due(age)]
    assert due[:heading.DENSE] == list(range(1, heading.DENSE + 1))
    assert len(due) < 30


def test_diagnose_tells_the_heading_in_the_finding_not_as_a_new_one() -> None:
    rng = random.Random(4)
    rows = {step: {"entropy": _entropy(step, rng)} for step in range(1, 261)}
    d = diagnose(LoggedRun(source="test", format="hf-trainer-state", name="r", rows=rows))
    sliding = [f for f in d.findings if f.alert == "EntropySliding"]
    assert [f.state for f in sliding if not f.escalated_from] == ["firing", "resolved"]
    assert "at step" in sliding[0].detail and "reaches EntropyCollapse's level" in \
        sliding[0].detail


def _curriculum_switch_kl() -> list[float]:
    """A healthy run's KL bumping up as its data set switches to harder prompts, then receding
    (the hard-negative benchmark's curriculum_switch, seed 9445): KLClimbing fires on it."""
    from bench.bench_hard_negatives import run_series

    return [float(v) for v in run_series("curriculum_switch", 9445, 400)["actor/kl"]]


def test_a_heading_that_moves_later_is_stated_but_not_sent() -> None:
    """The bump's heading is stated a step after the firing (sent: news); nine steps later the
    bump recedes and the level lies further off than stated: stated again, not sent. That
    update made a false alarm's fourth notification of one condition in a healthy run."""
    rules = default_rules()
    engine = AlertEngine(rules)
    events = [e for step, value in enumerate(_curriculum_switch_kl())
              for e in engine.evaluate(StepRecord("r", "actor", step, True, 1, 1, (),
                                                  {"actor/kl": value}))
              if e.alert == "KLClimbing"]
    assert [(e.state, e.repeat, e.notify) for e in events] == [
        ("firing", False, True), ("firing", True, True), ("firing", True, False),
        ("resolved", False, True)]
    first, later = (e for e in events if e.repeat)
    ranges = [tuple(float(x) + e.step for x in e.detail.split("90% range ")[1].split(" ")[0]
                    .split("-")) for e in (first, later)]
    assert ranges[1][0] > ranges[0][1], ranges  # wholly later than stated


def test_a_heading_nearer_than_stated_is_sent() -> None:
    rules = default_rules()
    (kl_climbing,) = [r for r in rules if r.name == "KLClimbing"]
    engine = AlertEngine(rules)
    for step, value in enumerate(_curriculum_switch_kl()[:162]):
        engine.evaluate(StepRecord("r", "actor", step, True, 1, 1, (), {"actor/kl": value}))
    state = engine.state("r", "actor", "KLClimbing")
    assert state is not None and state.firing and state.stated is not None
    state.stated = (1_000, 2_000)  # said far later than the metric now heads
    text, news = heading.refreshed(kl_climbing, state, rules, 163)
    assert text.startswith("actor/kl reaches KLDivergence's level") and news
    assert state.stated[1] < 1_000
