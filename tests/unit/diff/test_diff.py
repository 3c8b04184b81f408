"""``rlmon diff``: two seeds of one config are not called diverged, a change is found where it
begins and named by the metric it moved, not the noisiest; the runs come from files written by
their own writers (TensorBoard's event writer, W&B offline, transformers' TrainerState) and from
the history store, mixed."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from rlmon.cli import main
from rlmon.service.diff import RunSeries, diff_runs
from rlmon.service.diff.html import render_html
from rlmon.service.diff.runs import setting_differences
from tests.service.diagnose.test_diagnose_settings import write_segment
from tests.unit.diagnose.test_diagnose_trainer_state import write_state


def curves(seed: int, steps: int = 120, change_at: int | None = None,
           lr: float = 1e-5) -> dict[int, dict[str, float]]:
    """TRL's keys; the config fixes levels and trends, the seed the noise and a slow wander.
    From ``change_at`` the KL climbs (a policy moving faster); ``grad_norm`` is the noisiest
    metric by far and never changes."""
    rng = random.Random(seed)
    wander = 0.0
    rows = {}
    for step in range(1, steps + 1):
        wander = 0.9 * wander + 0.3 * rng.gauss(0, 1)
        moved = max(0, step - change_at) if change_at is not None else 0
        rows[step] = {
            "reward": 0.3 + 0.002 * step + 0.02 * (rng.gauss(0, 1) + wander),
            "kl": (0.02 + 0.0005 * step) * math.exp(0.05 * rng.gauss(0, 1) + 0.03 * moved),
            "entropy": 2.0 - 0.002 * step + 0.01 * rng.gauss(0, 1),
            "grad_norm": 1.0 + 0.8 * abs(rng.gauss(0, 1)),
            "completions/mean_length": 40 + 2 * rng.gauss(0, 1),
            "learning_rate": lr * (1 - step / (steps + 1)),
        }
    return rows


def series(label: str, rows: dict[int, dict[str, float]],
           config: dict[str, object] | None = None) -> RunSeries:
    by_key: dict[str, dict[int, float]] = {}
    for step, values in rows.items():
        for key, value in values.items():
            by_key.setdefault(key, {})[step] = value
    return RunSeries(label, label, "test", "test", by_key, config=config or {})


def test_two_seeds_of_one_config_are_not_called_diverged() -> None:
    for seed in range(6):
        result = diff_runs(series("a", curves(2 * seed)), series("b", curves(2 * seed + 1)))
        assert not result.diverged, result.headline()
        assert "no divergence beyond the runs' own noise" in result.headline()


def test_a_change_is_found_near_its_step_and_named_by_its_metric() -> None:
    result = diff_runs(series("a", curves(1)), series("b", curves(2, change_at=60)))
    assert result.diverged
    first = result.first
    assert first is not None and first.metric == "kl"  # not grad_norm, the noisiest
    assert first.onset is not None and 60 <= first.onset <= 90, first.describe()
    assert result.headline() == f"runs part ways at step {first.onset} (first diverging " \
                                "metric: kl)"
    assert not any(m.diverged for m in result.metrics if m.metric == "grad_norm")


def test_a_schedule_that_differs_is_reported_exactly_and_apart() -> None:
    result = diff_runs(series("a", curves(1)), series("b", curves(2, lr=3e-5)))
    (lr,) = result.exact_differences
    assert (lr.metric, lr.onset, lr.exact) == ("learning_rate", 1, True)
    assert result.first is None or result.first.metric != "learning_rate"


def test_settings_that_differ_leave_out_what_differs_between_any_two_runs() -> None:
    a = {"learning_rate": 1e-5, "output_dir": "out-a", "logging_dir": "x", "seed": 1,
         "_wandb.t": 3, "beta": 0.0, "list": [1, 2]}
    b = {"learning_rate": 3e-5, "output_dir": "out-b", "logging_dir": "y", "seed": 1,
         "_wandb.t": 4, "beta": 0.0, "list": [1, 3], "num_generations": 8}
    assert setting_differences(a, b) == [("learning_rate", 1e-5, 3e-5),
                                         ("num_generations", None, 8)]
    assert setting_differences(a, {}) == []  # one run recorded nothing: not a difference


def test_the_result_is_json_and_the_page_escapes_what_logs_say() -> None:
    hostile = "<script>alert(1)</script>"
    rows_a, rows_b = curves(1), curves(2, change_at=60)
    for rows in (rows_a, rows_b):
        for values in rows.values():
            values[hostile] = values["kl"]
    result = diff_runs(series("a", rows_a, {"x": hostile}), series("b", rows_b, {"x": "y"}))
    data = json.loads(json.dumps(result.to_json(), allow_nan=False))
    assert data["diverged"] and data["metric"] in ("kl", hostile)
    assert data["settings"] == [{"key": "x", "a": hostile, "b": "y"}]
    assert {m["metric"] for m in data["metrics"] if m["diverged"]} >= {"kl"}
    page = render_html(result)
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert "<svg" in page and "parts at step" in page


def _tensorboard(directory: Path, rows: dict[int, dict[str, float]], lr: float) -> Path:
    directory.mkdir(parents=True)
    write_segment(directory, {"output_dir": str(directory), "learning_rate": lr,
                              "gradient_accumulation_steps": 1,
                              "per_device_train_batch_size": 8}, rows)
    return directory


def test_diff_of_tensorboard_and_trainer_state_files(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    a = _tensorboard(tmp_path / "a" / "runs" / "x", curves(1), 1e-5)
    b = _tensorboard(tmp_path / "b" / "runs" / "x", curves(2, change_at=60, lr=3e-5), 3e-5)
    page = tmp_path / "diff.html"
    assert main(["diff", str(a), str(b), "--html", str(page)]) == 0
    out = capsys.readouterr().out
    assert "runs part ways at step" in out and "first diverging metric: actor/kl" in out
    assert "learning_rate: 1e-05 -> 3e-05" in out
    assert "output_dir" not in out
    assert "differs exactly: actor/lr (train/learning_rate): differs from step 1" in out
    assert "runs part ways" in page.read_text()
    # the same run as trainer_state.json against its TensorBoard events: nothing parts
    state = write_state(tmp_path / "state" / "trainer_state.json", curves(1))
    assert main(["diff", str(state), str(a), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["diverged"] is False and data["a"]["format"] == "hf-trainer-state"
    assert data["b"]["format"] == "tensorboard"
    assert all(not m["diverged"] for m in data["metrics"])
    assert data["settings"] == []  # the state has no training_args.bin: nothing compared
