"""The baseline detector's batch predictions (rlmon.service.alerting.baseline_batch) are the very
numbers ``baseline.predict`` gives step by step, for every early-warning rule's parameters (log
transform, level-only, up and down) on noisy, drifting, stepped, constant and faulty series;
and a long batch evaluated in order raises the same alerts at the same steps as the engine fed
one step at a time."""

from __future__ import annotations

import math
import random
from collections import deque

import pytest

from rlmon.service.alerting import baseline, baseline_batch
from rlmon.service.alerting.baseline_batch import MIN_SERIES, SeriesPredictions
from rlmon.service.alerting.engine import AlertEngine, evaluate_in_order
from rlmon.service.alerting.rules import default_rules
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.metrics.catalog import EARLY_WARNINGS


def _series(kind: str, n: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    if kind == "noise":
        return [1.0 + 0.1 * rng.gauss(0, 1) for _ in range(n)]
    if kind == "drift":
        return [max(1e-6, 2.0 - 1e-3 * i + 0.01 * rng.gauss(0, 1)) for i in range(n)]
    if kind == "stepped":  # a fraction of 8 groups, a lag in whole steps
        return [0.125 * rng.randint(0, 3) for _ in range(n)]
    if kind == "constant":
        return [0.5] * n
    if kind == "clipped":  # piled at 0 a third of the time, and at 1 for a stretch
        return [min(1.0, max(0.0, 0.05 + 0.1 * rng.gauss(0, 1) + (1.0 if 300 <= i < 400 else 0)))
                for i in range(n)]
    # a healthy stretch, then a climb and a collapse
    return [0.3 + 0.01 * rng.gauss(0, 1) if i < n // 2 else 0.3 * 1.01 ** (i - n // 2)
            if i < 3 * n // 4 else 1e-4 * rng.random() for i in range(n)]


@pytest.mark.parametrize("kind", ["noise", "drift", "stepped", "constant", "clipped", "fault"])
def test_batch_predictions_are_predict_bit_for_bit(kind: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(baseline_batch, "_BLOCK", 97)  # many blocks, uneven boundaries
    for index, spec in enumerate(EARLY_WARNINGS):
        params = spec.params
        values = _series(kind, 700, seed=index)
        series = SeriesPredictions(params, values)
        history: deque[float] = deque()
        compared = 0
        for value in values:
            known = series.take(len(history), value)
            if len(history) >= params.window:
                assert known is not None
                for extrapolate, (expected, scale) in ((True, known[0]), (False, known[1])):
                    assert (expected, scale) == baseline.predict(params, history, extrapolate), \
                        (spec.metric, kind, len(history))
                    compared += 1
            history.append(value)
            while len(history) > params.window:
                history.popleft()
        assert compared == 2 * (len(values) - params.window)


def test_a_value_off_the_series_falls_back_for_good() -> None:
    params = EARLY_WARNINGS[0].params
    values = _series("noise", 200, seed=1)
    series = SeriesPredictions(params, values)
    history = deque(values[:params.window])
    for i in range(params.window):
        series.take(i, values[i])
    assert series.take(len(history), values[params.window] + 1.0) is None
    assert series.take(len(history), values[params.window + 1]) is None  # never again


def _records(n: int, seed: int) -> list[StepRecord]:
    rng = random.Random(seed)
    out = []
    for step in range(n):
        slide = step > n // 2
        metrics = {
            "actor/entropy": (0.002 if slide else 2.0) + 0.01 * rng.gauss(0, 1)
            + (-(step - n // 2) * 1e-3 if slide else 0.0),
            "actor/kl": 0.01 + 1e-4 * rng.random() + (1e-4 * (step - n // 2) if slide else 0),
            "actor/grad_norm": 1.0 + 0.1 * rng.random(),
            "rollout/reward": 0.3 + 0.02 * rng.gauss(0, 1),
        }
        if step % 97 == 0:
            metrics["actor/grad_norm"] = math.nan  # not observed: the series skips it
        if step % 13 == 0:
            del metrics["actor/kl"]
        out.append(StepRecord(run="r", role="trainer", step=step, complete=True, ranks_expected=1,
                              ranks_reporting=1, missing_ranks=(), metrics=metrics))
    return out


def test_a_long_batch_raises_the_same_alerts_as_step_by_step() -> None:
    records = _records(MIN_SERIES + 500, seed=3)
    batch = evaluate_in_order(AlertEngine(default_rules()), records)
    assert any(state.ahead is not None for state in AlertEngine(default_rules()).states.values()) \
        is False  # a fresh engine holds none
    one_by_one = AlertEngine(default_rules())
    expected = [(r.step, [(e.alert, e.state, e.value) for e in one_by_one.evaluate(r)])
                for r in records]
    got = [(r.step, [(e.alert, e.state, e.value) for e in events]) for r, events in batch]
    assert got == expected
    assert any(events for _, events in got)  # the slide was seen
