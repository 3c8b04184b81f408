"""``bench/bench_reward_hacking_bound.py``: the learned bound set beside ``RewardHacking``. Its
features are the departures the docstring names (checked against numpy's own line fit), its
threshold fires on none of the runs it was set on, and it names what is plainly a hack."""

from __future__ import annotations

import numpy as np
import pytest

from bench import bench_reward_hacking as bench
from bench import bench_reward_hacking_bound as bound
from rlmon.service.alerting import reward_hacking as rh
from rlmon.service.metrics import catalog as c


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_departures_are_the_newest_steps_off_a_least_squares_line_in_its_robust_noise(
        seed: int) -> None:
    rng = np.random.default_rng(seed)
    values = np.cumsum(rng.normal(0.01, 0.05, 120)) + 0.3
    got = bound.departures(values)
    assert np.isnan(got[:bound.FIRST - 1]).all()
    for step in (bound.FIRST - 1, 80, 119):
        start = step - bound.FIRST + 1
        base = values[start:start + bound.BASE]
        slope, intercept = np.polyfit(np.arange(bound.BASE), base, 1)
        residuals = base - (intercept + slope * np.arange(bound.BASE))
        scale = max(1.4826 * np.median(np.abs(residuals - np.median(residuals))),
                    1e-3 + 0.01 * abs(np.median(base)))
        newest = values[start + bound.BASE:step + 1]
        expected = (newest - (intercept + slope * np.arange(bound.BASE, bound.FIRST))) / scale
        np.testing.assert_allclose(got[step], expected, rtol=1e-9, atol=1e-9)
    assert np.isnan(bound.departures(np.full(120, np.nan))).all()


def test_the_rules_own_scores_are_its_evidence_unpinned() -> None:
    """The bound sees the evidence the rule sums: its z-scores, step by step, as the rule's
    :func:`observe` computes them (never pinned, so a firing alert does not change them)."""
    case = next(case for case in bench.cases(range(1, 2)) if case.kind == "climb")
    series = bench.series_of(case)
    scores = bound.rule_scores(series)
    for step in (40, case.onset + 10):
        found = rh._evidence(rh.RewardHackingParams(), history_before(series, step),
                             rh.row(rh.RewardHackingParams(), at(series, step)), False)
        assert found is not None
        np.testing.assert_allclose(scores[step], [found.z_reward, found.z_length, found.z_kl,
                                                  found.z_gap])
    first = rh.RewardHackingParams().warmup + rh.RewardHackingParams().guard
    assert np.isnan(scores[:first]).all() and not np.isnan(scores[first, :3]).any()


def at(series: bench.Series, step: int) -> dict[str, float]:
    return {name: float(v[step]) for name, v in series.items()}


def history_before(series: bench.Series, step: int) -> list[float]:
    params = rh.RewardHackingParams()
    rows: list[float] = []
    for earlier in range(max(0, step - params.keep), step):
        new = rh.row(params, at(series, earlier))
        assert new is not None
        rows.extend(new)
    return rows


def test_the_bound_fires_on_none_of_the_runs_its_threshold_was_set_on_and_names_a_plain_hack(
        ) -> None:
    try:
        import lightgbm  # noqa: F401
    except (ImportError, OSError) as exc:  # OSError: its OpenMP runtime (libgomp) is missing
        pytest.skip(f"lightgbm cannot be loaded: {exc}")
    model = bound.learn(bound.dataset((range(0, 24),)), rounds=60)
    held = bound.dataset((range(7000, 7008),))
    limits = bound.thresholds(model, held)
    assert limits[0] >= limits[1] >= limits[3]
    for case, f in held:
        judged = f[bound.FIRST:] if case.kind in bound.QUIET else f[bound.FIRST:case.onset]
        assert not (model.predict(judged) > limits[0]).any(), case
    rows = bench.issue_run(3)  # issue 39's run: reward, length and KL climbing together
    series = {name: np.array([r[name] for r in rows]) for name in rows[0]}
    f = bound.features(series)
    assert f.shape == (bench.ISSUE_STEPS, 9 * bound.RECENT + 9 * len(bound.MEANS))
    assert np.isnan(f[:, 3 * bound.RECENT:5 * bound.RECENT]).all()  # no verifier logged
    assert c.VERIFIER_SCORE not in series
    lag = bound.lag(model, f, bench.ISSUE_ONSET, limits[0])
    assert lag is not None and lag <= bench.WITHIN, lag
