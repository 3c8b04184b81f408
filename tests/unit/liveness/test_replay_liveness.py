"""``rlmon replay`` reproduces the time-based alerts its records' ``time`` fields show, and
``replay --rules`` backtests them (docs/liveness.md says what replay cannot see)."""

from __future__ import annotations

import json

from rlmon.service.alerting.backtest import backtest
from rlmon.service.alerting.rules import default_rules, parse_rules
from rlmon.service.replay import replay

T0 = 1_700_000_000.0


def _line(step: int, at: float, run: str = "r") -> str:
    return json.dumps({"run": run, "role": "actor", "step": step, "time": at,
                       "metrics": {"actor/loss": {"sum": 1.0, "count": 1.0}}})


def _times() -> list[float]:
    """Two-second steps, a ten-minute gap after step 29 (a hang that recovered), then 10x slower
    steps from step 60."""
    times, at = [], T0
    for step in range(80):
        times.append(at)
        at += 600.0 if step == 29 else (20.0 if step >= 60 else 2.0)
    return times


def test_a_gap_replays_as_a_stall_that_resolves_and_slow_steps_as_a_regression() -> None:
    lines = [_line(step, at) for step, at in enumerate(_times())]
    result = replay(lines)
    got = [(e.step, e.alert, e.state) for e in result.alerts
           if e.alert in ("RunStalled", "StepTimeRegression")]
    assert got[:2] == [(29, "RunStalled", "firing"), (30, "RunStalled", "resolved")]
    assert (62, "StepTimeRegression", "firing") in got or (63, "StepTimeRegression",
                                                             "firing") in got
    assert not [e for e in result.alerts if e.alert in ("RunDied", "StageStuck")]


def test_records_without_time_replay_no_time_based_alert() -> None:
    lines = [json.dumps({"run": "r", "role": "actor", "step": s,
                         "metrics": {"actor/loss": {"sum": 1.0, "count": 1.0}}})
             for s in range(50)]
    assert not [e for e in replay(lines).alerts if e.alert == "RunStalled"]


def test_backtest_lists_the_stall_episodes_and_a_retuned_pack_can_disable_them() -> None:
    lines = [_line(step, at) for step, at in enumerate(_times())]
    rules = default_rules()
    tested = {t.rule: t for t in backtest(rules, replay(lines, rules).steps)}
    assert [(e.fired, e.resolved) for e in tested["RunStalled"].episodes] == [(29, 30)]
    quiet = parse_rules("disable: [RunStalled]\n")
    assert not [e for e in replay(lines, quiet).alerts if e.alert == "RunStalled"]
