"""Cost and course from any log (issue 31): step times from what the files carry (TensorBoard's
event wall times, W&B's ``_timestamp``, the Trainer's ``train_runtime`` and TRL's ``step_time``
in ``trainer_state.json``), GPU-hours per step and of each finding's span, priced; and where a
metric heads for a known level, in steps and hours with a range. Files written by their own
writers (TensorBoard's, W&B's in offline mode, transformers' TrainerState)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from rlmon.cli import main
from rlmon.service.diagnose.findings import diagnose
from rlmon.service.diagnose.formats import read_paths
from tests.support.diagnose_support import trl_curves
from tests.unit.diagnose.test_diagnose_trainer_state import write_state

T0 = 1_700_000_000.0
STEP_SECONDS = 30.0


def write_timed_tensorboard(directory: Path, rows: dict[int, dict[str, float]]) -> Path:
    """As the Hugging Face callback logs them, a step every 30 s of wall time."""
    from tensorboard.summary import Writer

    writer = Writer(str(directory))
    for step, values in rows.items():
        for key, value in values.items():
            writer.add_scalar(f"train/{key}", value, step=step,
                              wall_time=T0 + STEP_SECONDS * step)
    writer.close()
    return directory


def _sliding_entropy(steps: int = 60) -> dict[int, dict[str, float]]:
    """A healthy run whose entropy halves every 20 steps: 0.01 is reached at step ~152.9."""
    rows = trl_curves(steps)
    for step, row in rows.items():
        row["entropy"] = 2.0 * 0.5 ** (step / 20)
    return rows


def test_tensorboard_wall_times_price_each_finding(tmp_path: Path) -> None:
    write_timed_tensorboard(tmp_path / "run", trl_curves(fault="tied_rewards", at=25))
    (run,), _ = read_paths([tmp_path])
    d = diagnose(run, gpus=8, price=3.0)
    assert d.clock is not None and d.clock.how == "TensorBoard event wall times"
    assert d.clock.seconds_per_step == STEP_SECONDS
    assert d.clock.gpu_hours(d.clock.seconds_per_step) == pytest.approx(30 * 8 / 3600)
    firing = next(f for f in d.findings if f.alert == "NoLearningSignal")
    assert firing.cost is not None  # never resolved: steps 25 to the run's end, 40
    assert (firing.cost.first, firing.cost.last) == (25, 40)
    assert firing.cost.gpu_hours == pytest.approx(16 * 30 * 8 / 3600)
    assert firing.cost.money == pytest.approx(16 * 30 * 8 / 3600 * 3.0)
    assert firing.cost.words == "wasted while no learning signal"


def test_tensorboard_projection_of_a_sliding_entropy(tmp_path: Path) -> None:
    write_timed_tensorboard(tmp_path / "run", _sliding_entropy())
    (run,), _ = read_paths([tmp_path])
    d = diagnose(run)
    entropy = next(p for p in d.projections if p.target.metric == "actor/entropy")
    truth = 20 * math.log2(2.0 / 0.01) - 60  # steps left after step 60
    assert entropy.earliest <= truth <= entropy.latest
    assert entropy.steps == pytest.approx(truth, rel=0.05)
    hours = entropy.to_json(d.seconds_per_step)["hours"]
    assert hours == pytest.approx(entropy.steps * STEP_SECONDS / 3600, rel=1e-2)


def test_trainer_state_step_time_and_train_runtime(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    rows = trl_curves(fault="entropy_collapse", at=25)
    path = write_state(tmp_path / "uniform" / "trainer_state.json", rows)  # train_runtime 12.5
    (run,), _ = read_paths([path])
    d = diagnose(run, gpus=4)
    assert d.clock is not None and d.clock.how.startswith("train_runtime")
    assert d.clock.total_seconds == pytest.approx(12.5)
    collapse = next(f for f in d.findings if f.alert == "EntropyCollapse")
    assert collapse.cost is not None and collapse.cost.words == "while collapsed"
    assert collapse.cost.gpu_hours == pytest.approx(16 * 12.5 / 40 * 4 / 3600)
    for step, row in rows.items():  # TRL's own per-step time wins over the summary
        row["step_time"] = 2.0 + (step % 2)
    path = write_state(tmp_path / "timed" / "trainer_state.json", rows)
    assert main(["diagnose", str(path), "--gpus", "4", "--price-per-gpu-hour", "2.5",
                 "--json"]) == 0
    out = capsys.readouterr().out.splitlines()
    source = json.loads(out[0])
    assert source["cost"]["how"] == "the logged step_time"
    assert source["cost"]["seconds"] == pytest.approx(sum(2.0 + s % 2 for s in rows))
    assert source["cost"]["money"] == pytest.approx(source["cost"]["gpu_hours"] * 2.5, rel=1e-5)
    finding = next(json.loads(line) for line in out[1:]
                   if json.loads(line).get("alert") == "EntropyCollapse")
    assert finding["cost"]["first_step"] == 25 and finding["cost"]["last_step"] == 40


def test_the_terminal_says_time_cost_and_heading(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    write_timed_tensorboard(tmp_path / "run", _sliding_entropy())
    main(["diagnose", str(tmp_path), "--gpus", "8", "--price-per-gpu-hour", "3"])
    out = capsys.readouterr().out
    assert "time: 60 steps, 30.0 min (30 s a step; TensorBoard event wall times); 8 GPUs " \
           "(--gpus): 4 GPU-hours, 0.0667 a step, about $12.00 at $3/GPU-hour" in out
    assert "heading: actor/entropy reaches EntropyCollapse's level (0.01) in about" in out


def test_report_over_a_foreign_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``rlmon report`` of a TensorBoard directory (it refused: "no history store at ...")."""
    write_timed_tensorboard(tmp_path / "run", trl_curves(fault="tied_rewards", at=25))
    assert main(["report", str(tmp_path), "--gpus", "8", "--price-per-gpu-hour", "3",
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["cost"]["gpu_hours"] == pytest.approx(40 * 30 * 8 / 3600)
    (wasted,) = [c for c in report["findings_cost"] if c["alert"] == "NoLearningSignal"]
    assert wasted["money"] == pytest.approx(16 * 30 * 8 / 3600 * 3)
    assert {a["alert"] for a in report["alerts"]} >= {"NoLearningSignal"}
    page = tmp_path / "report.html"
    assert main(["report", str(tmp_path / "run"), "--gpus", "8", "--html", str(page)]) == 0
    out = capsys.readouterr().out
    assert "wasted while no learning signal" in out
    assert "wasted while no learning signal" in page.read_text()
