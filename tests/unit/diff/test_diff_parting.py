"""Where two runs part (issue 39): a run's own departure never widens its noise bar, NaN and Inf
are a parting, the same numbers read from two formats never differ, host and hardware telemetry
never headline, and the counts and labels say what was compared."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from rlmon.service.diagnose.formats import read_paths
from rlmon.service.diff import RunSeries, diff_runs
from rlmon.service.diff.runs import from_logged
from rlmon.service.diff.text import render_text
from tests.service.diagnose.test_diagnose_settings import write_segment
from tests.unit.diagnose.test_diagnose_trainer_state import write_state


def grpo(seed: int, steps: int = 150, **faults: int) -> dict[int, dict[str, float]]:
    """A GRPO run's TRL keys at 20 s a step; ``kl_blowup=S``: the KL x1.15 a step from S;
    ``nan=S``: grad norm and loss NaN from S; ``jump=S``: the KL x10 from S."""
    rng = random.Random(seed)
    wander = 0.0
    rows = {}
    for step in range(1, steps + 1):
        wander = 0.9 * wander + 0.3 * rng.gauss(0, 1)
        kl = (0.01 + 0.0001 * step) * math.exp(0.1 * rng.gauss(0, 1) + 0.05 * wander)
        if "kl_blowup" in faults and step >= faults["kl_blowup"]:
            # x1.15 a step until it levels off near 40 (where the run stood)
            kl = min(kl * 1.15 ** (step - faults["kl_blowup"] + 1), 40 * math.exp(0.05 * wander))
        if "jump" in faults and step >= faults["jump"]:
            kl *= 10
        row = {"reward": 0.3 + 0.002 * step + 0.03 * (rng.gauss(0, 1) + 0.3 * wander),
               "kl": kl, "entropy": 0.45 - 0.0005 * step + 0.01 * rng.gauss(0, 1),
               "grad_norm": 0.8 * math.exp(0.2 * rng.gauss(0, 1)),
               "loss": 0.02 * rng.gauss(0, 1),
               "completions/mean_length": 300 + 10 * rng.gauss(0, 1) + 0.5 * step,
               "step_time": 20 + rng.gauss(0, 1),
               "learning_rate": 1e-6 * min(1.0, step / 10)}
        if "nan" in faults and step >= faults["nan"]:
            row["grad_norm"] = row["loss"] = math.nan
        rows[step] = row
    return rows


def series(label: str, rows: dict[int, dict[str, float]]) -> RunSeries:
    by_key: dict[str, dict[int, float]] = {}
    for step, values in rows.items():
        for key, value in values.items():
            by_key.setdefault(key, {})[step] = value
    return RunSeries(label, label, "test", "test", by_key)


def test_a_kl_blowup_parts_where_it_begins_not_where_its_own_noise_allows() -> None:
    for seed in range(4):
        result = diff_runs(series("a", grpo(2 * seed)), series("b", grpo(2 * seed + 1,
                                                                            kl_blowup=50)))
        first = result.first
        assert first is not None and first.metric == "kl", result.headline()
        assert first.onset is not None and 50 <= first.onset <= 55, first.describe()


def test_a_tenfold_departure_is_found_within_five_steps_of_its_onset() -> None:
    for seed in range(4):
        result = diff_runs(series("a", grpo(2 * seed)), series("b", grpo(2 * seed + 1,
                                                                            jump=90)))
        first = result.first
        assert first is not None and first.metric == "kl", result.headline()
        assert first.onset is not None and 90 <= first.onset <= 95, first.describe()


def test_nan_in_one_run_is_a_parting_at_its_first_step() -> None:
    result = diff_runs(series("a", grpo(1)), series("b", grpo(2, nan=40)))
    assert result.diverged, result.headline()
    first = result.first
    assert first is not None and first.onset == 40 and first.metric in ("grad_norm", "loss")
    assert "NaN" in first.describe() and "from step 40" in first.describe()
    both = diff_runs(series("a", grpo(1, nan=40)), series("b", grpo(2, nan=40)))
    assert not any(m.nonfinite for m in both.metrics)  # NaN alike in both: not a parting
    broken = grpo(2)
    for step in range(60, 151):
        broken[step]["learning_rate"] = math.inf  # a schedule too: no noise, still a parting
    result = diff_runs(series("a", grpo(1)), series("b", broken))
    (lr,) = [m for m in result.parted if m.metric == "learning_rate"]
    assert lr.onset == 60 and "Inf in B from step 60" in lr.describe()


def test_the_same_numbers_in_two_formats_never_differ(tmp_path: Path) -> None:
    for seed in range(3):
        rows = grpo(seed)
        board = tmp_path / f"tb{seed}" / "runs" / "x"
        board.mkdir(parents=True)
        write_segment(board, {"learning_rate": 1e-6}, rows)  # float32, as TensorBoard keeps them
        state = write_state(tmp_path / f"st{seed}" / "trainer_state.json", rows)  # float64 JSON
        runs = [read_paths([path])[0][0] for path in (board, state)]
        result = diff_runs(from_logged(runs[0], "tb"), from_logged(runs[1], "state"))
        assert not result.diverged, render_text(result)
        assert not [m for m in result.metrics if m.diverged], render_text(result)


def test_the_same_numbers_rounded_by_a_format_never_differ() -> None:
    rows = grpo(5)
    rounded = {s: {k: round(v, 4) for k, v in r.items()} for s, r in rows.items()}
    result = diff_runs(series("a", rows), series("b", rounded))
    assert not [m for m in result.metrics if m.diverged], render_text(result)


def test_host_telemetry_is_told_apart_and_never_headlines() -> None:
    a, b = grpo(1), grpo(2, jump=90)
    for rows, cores, rss in ((a, 3.0, 2.1e9), (b, 5.0, 3.4e9)):
        for values in rows.values():
            values["perf/host_cpu_cores"] = cores
            values["perf/host_rss_bytes"] = rss
            values["perf/gpu_utilization"] = 0.7 if cores == 3 else 0.4
    result = diff_runs(series("a", a), series("b", b))
    first = result.first
    assert first is not None and first.metric == "kl"
    telemetry = {m.metric for m in result.metrics if m.telemetry}
    assert telemetry == {"perf/host_cpu_cores", "perf/host_rss_bytes", "perf/gpu_utilization"}
    text = render_text(result)
    assert "setting or a schedule" not in text.split("host and hardware")[1], text
    lines = text.splitlines()
    assert lines.index(next(x for x in lines if "kl" in x and "parts at step" in x)) < \
        lines.index(next(x for x in lines if "perf/host_cpu_cores" in x))


def test_the_headline_counts_every_metric_compared() -> None:
    a = {s: {"learning_rate": 1e-6, "beta": 0.04, "kl": 0.01} for s in range(1, 60)}
    result = diff_runs(series("a", a), series("b", a))
    assert not result.diverged
    assert result.headline().endswith("(3 metrics compared)"), result.headline()
    assert result.compared() == "3 metrics compared: 0 against their noise, 3 value for value"
    assert "3 metrics compared: 0 against their noise" in render_text(result)


def test_a_discrete_metric_that_rarely_moves_is_not_called_a_setting() -> None:
    rng_a, rng_b = random.Random(1), random.Random(2)
    # a count that steps by one now and then, at other steps in each run
    def count(rng: random.Random) -> dict[int, dict[str, float]]:
        value, rows = 3.0, {}
        for step in range(1, 121):
            if rng.random() < 0.05:
                value += rng.choice((-1.0, 1.0))
            rows[step] = {"num_truncated": value}
        return rows
    result = diff_runs(series("a", count(rng_a)), series("b", count(rng_b)))
    text = render_text(result)
    assert "a setting or a schedule" not in text, text


def test_a_count_that_agrees_by_chance_at_first_is_judged_by_its_noise() -> None:
    # two seeds of a count that is 3 and now and then 4: their first steps agree by chance,
    # which is no sign of one seed and one data order (a false parting before)
    def count(seed: int) -> dict[int, dict[str, float]]:
        rng = random.Random(seed)
        rows = {step: {"num_truncated": 4.0 if rng.random() < 0.2 else 3.0}
                for step in range(1, 121)}
        for step in range(1, 6):
            rows[step] = {"num_truncated": 3.0}
        return rows
    for seed in range(3, 8):
        result = diff_runs(series("a", count(seed)), series("b", count(seed + 100)))
        assert not result.parted, render_text(result)


def test_the_values_quoted_are_said_to_be_from_the_step_that_confirmed_the_departure() -> None:
    """The departure is dated back to where it began, but the values beside it are the
    smoothed ones where the test confirmed it, steps later: the line says which step they are
    from, and they are the trailing 7-step medians of each run there (a numpy reference)."""
    import numpy as np

    a_rows, b_rows = grpo(0), grpo(1, jump=60)
    result = diff_runs(series("a", a_rows), series("b", b_rows))
    kl = next(m for m in result.metrics if m.metric == "kl")
    assert kl.onset is not None and 60 <= kl.onset <= 63, kl.describe()
    assert kl.value_step is not None and kl.value_step > kl.onset
    assert f"parts at step {kl.onset} (at step {kl.value_step}: " in kl.describe()
    for rows, value in ((a_rows, kl.a_value), (b_rows, kl.b_value)):
        window = [rows[s]["kl"] for s in range(kl.value_step - 6, kl.value_step + 1)]
        assert value == pytest.approx(np.exp(np.median(np.log(window))), rel=1e-12)
    assert result.to_json()["metrics"][[m.metric for m in result.metrics].index("kl")][
        "value_step"] == kl.value_step
