"""What moved first: the related metric that left its baseline before the others, at a firing."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rlmon.commands.deliver import deliver_alerts
from rlmon.service.alerting.engine import AlertEngine, evaluate_in_order
from rlmon.service.alerting.first_mover import (
    KEEP,
    RELATED,
    FirstMovers,
    departure,
    explain_steps,
    first_moved,
)
from rlmon.service.alerting.rules import default_rules
from rlmon.service.metrics import catalog as c
from rlmon.service.replay import replay
from tests.support.records import step_record

SYNC_FIRST = ("`actor/logp_diff` rose 4 steps before `actor/is_ratio_min` fell: look at the "
              "weight sync first")


def stale_weights(steps: int = 60, drift_at: int = 40, lag: int = 4, seed: int = 3
                  ) -> dict[str, np.ndarray]:
    """A weight sync that stopped at ``drift_at``: the mean mismatch rises at once, the smallest
    IS ratio falls ``lag`` steps later (as the tails of the stale distribution grow)."""
    rng = np.random.default_rng(seed)
    t = np.arange(steps)
    diff = 0.02 * np.exp(0.05 * rng.standard_normal(steps))
    diff = np.where(t >= drift_at, diff * (1 + 0.6 * (t - drift_at + 1)), diff)
    low = 0.5 * np.exp(0.05 * rng.standard_normal(steps))
    low = np.where(t >= drift_at + lag, low * 0.6 ** (t - drift_at - lag + 1), low)
    return {c.LOGP_DIFF: diff, c.IS_RATIO_MIN: low}


def history(series: dict[str, np.ndarray]) -> dict[str, list[tuple[int, float]]]:
    return {name: [(i, float(v)) for i, v in enumerate(values)]
            for name, values in series.items()}


def test_the_mismatch_that_rose_first_names_the_weight_sync() -> None:
    s = stale_weights()
    fired = next(i for i, v in enumerate(s[c.IS_RATIO_MIN]) if v < 0.1)  # ISRatioStale's bound
    assert fired > 44
    assert first_moved("ISRatioStale", history(s), fired) == SYNC_FIRST
    # the same sentence at the mean mismatch's own alert: both moved before it fired
    assert first_moved("LogprobMismatch", history(s), fired) == SYNC_FIRST


def test_the_ratio_falling_first_points_at_a_few_tokens() -> None:
    s = stale_weights()
    swapped = {c.LOGP_DIFF: np.roll(s[c.LOGP_DIFF], 6), c.IS_RATIO_MIN: s[c.IS_RATIO_MIN]}
    swapped[c.LOGP_DIFF][:6] = s[c.LOGP_DIFF][:6]
    text = first_moved("ISRatioStale", history(swapped), 55)
    assert text.startswith("`actor/is_ratio_min` fell 2 steps before `actor/logp_diff` rose")
    assert "worst samples" in text


def test_nothing_is_said_for_one_mover_a_tie_or_an_unrelated_alert() -> None:
    s = stale_weights()
    only_diff = {c.LOGP_DIFF: s[c.LOGP_DIFF]}
    assert first_moved("ISRatioStale", history(only_diff), 55) == ""
    tied = stale_weights(lag=0)
    assert first_moved("ISRatioStale", history(tied), 55) == ""
    assert first_moved("RankMissing", history(s), 55) == ""
    assert first_moved("ISRatioStale", history(s), 30) == ""  # before anything moved


def test_a_one_step_outlier_or_a_jittering_lag_is_not_a_departure() -> None:
    rng = np.random.default_rng(0)
    calm = list(enumerate(0.3 * np.exp(0.05 * rng.standard_normal(50))))
    spiked = [(s, v * (20 if s == 45 else 1)) for s, v in calm]
    assert departure(spiked, "up", 49) is None
    lag = [(s, 1.0 + (s % 5 == 0)) for s in range(60)]  # a lag of 1, now and then 2
    assert departure(lag, "up", 59) is None
    risen = [(s, v * (3 if s >= 45 else 1)) for s, v in calm]
    assert departure(risen, "up", 49) == 45
    assert departure(risen, "down", 49) is None  # the wrong direction


def test_every_related_metric_is_in_the_catalog_and_every_alert_a_default_rule() -> None:
    names = {r.name for r in default_rules()}
    assert set(RELATED) <= names
    for alert, movers in RELATED.items():
        assert len(movers) >= 2, alert
        for mover in movers:
            assert c.lookup(mover.metric) is not None, (alert, mover.metric)


def test_the_service_tracker_spans_roles_is_bounded_and_forgets() -> None:
    s = stale_weights(steps=80)
    movers = FirstMovers()
    for step in range(80):  # the rollout's lag and the trainer's mismatch, two streams
        movers.observe(step_record(run="r", role="actor", step=step, metrics={
            c.LOGP_DIFF: float(s[c.LOGP_DIFF][step]),
            c.IS_RATIO_MIN: float(s[c.IS_RATIO_MIN][step]), "actor/other": 1.0}))
        movers.observe(step_record(run="r", role="rollout", step=step,
                                   metrics={c.POLICY_LAG: 1.0}))
    fired = next(i for i, v in enumerate(s[c.IS_RATIO_MIN]) if v < 0.1)
    # one step's firing (the default rule waits for three in a row)
    engine = AlertEngine([r.model_copy(update={"for_steps": 1}) if r.name == "ISRatioStale"
                          else r for r in default_rules()])
    event = next(e for e in engine.evaluate(step_record(
        run="r", step=fired, metrics={c.IS_RATIO_MIN: 0.05})) if e.alert == "ISRatioStale")
    (told,) = movers.explain([event])
    assert told.first_moved == SYNC_FIRST
    held = movers._runs["r"][1]
    assert set(held) == {c.LOGP_DIFF, c.IS_RATIO_MIN, c.POLICY_LAG}  # only related metrics
    assert all(len(v) == KEEP for v in held.values())  # bounded
    movers.observe(step_record(run="r", step=0, attempt=1, metrics={c.LOGP_DIFF: 0.02}))
    assert len(movers._runs["r"][1][c.LOGP_DIFF]) == 1  # a new attempt starts afresh
    movers.forget(["r"])
    assert len(movers) == 0
    assert movers.explain([event]) == [event]


def test_a_replay_explains_firings_with_every_role_known() -> None:
    s = stale_weights()
    records = []
    for step in range(60):
        records.append(step_record(run="r", role="actor", step=step,
                                   metrics={c.LOGP_DIFF: float(s[c.LOGP_DIFF][step])}))
        records.append(step_record(run="r", role="ref", step=step,
                                   metrics={c.IS_RATIO_MIN: float(s[c.IS_RATIO_MIN][step])}))
    steps = explain_steps(evaluate_in_order(AlertEngine(default_rules()), records))
    stale = [e for _, es in steps for e in es if e.alert == "ISRatioStale" and e.state == "firing"]
    assert stale and stale[0].first_moved == SYNC_FIRST


def test_replay_alerts_to_console_say_what_moved_first(capsys: pytest.CaptureFixture[str]) -> None:
    """`rlmon replay FILE --alerts-to console` (the command's delivery path) prints it."""
    s = stale_weights()
    lines = [json.dumps({"run": "r", "role": "actor", "step": step, "metrics": {
        c.LOGP_DIFF: {"sum": float(s[c.LOGP_DIFF][step]), "count": 1},
        c.IS_RATIO_MIN: {"min": float(s[c.IS_RATIO_MIN][step])}}}) for step in range(60)]
    assert deliver_alerts(replay(lines), ["console"], None, all_severities=True) == 0
    err = capsys.readouterr().err
    assert "ISRatioStale" in err
    assert f"what moved first: {SYNC_FIRST}" in err
    assert "what to change: The rollout engine samples" in err  # no framework: plain words
