"""``rlmon diagnose`` on the files the frameworks' own loggers write, on CPU: verl's ``file``
tracking backend (``verl.utils.tracking.Tracking``, JSON lines through orjson, NaN as null) and
OpenRLHF's TensorBoard logger (``openrlhf.utils.logging_utils.TensorboardLogger``, ``train/``
keys through torch's SummaryWriter). SkyRL has no file format of its own (its trackers are W&B,
TensorBoard, MLflow, SwanLab and the console); its TensorBoard adapter writes keys as given.

The curves are TRL-shaped training curves renamed to each framework's keys; faults are injected
from step 25 and must be found at their steps."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from rlmon.service.diagnose.findings import diagnose
from rlmon.service.diagnose.formats import read_paths
from tests.support.diagnose_support import fired, trl_curves
from tests.support.extras import optional_import

pytestmark = pytest.mark.frameworks

optional_import("torch")
optional_import("verl")
optional_import("openrlhf")

RENAME = {
    "verl": {"loss": "actor/pg_loss", "grad_norm": "actor/grad_norm", "learning_rate": "actor/lr",
             "reward": "critic/score/mean", "entropy": "actor/entropy", "kl": "actor/kl_loss",
             "clip_ratio/region_mean": "actor/pg_clipfrac",
             "completions/mean_length": "response_length/mean", "epoch": "training/epoch"},
    "openrlhf": {"loss": "policy_loss", "grad_norm": "actor_grad_norm",
                 "learning_rate": "actor_lr", "reward": "reward", "entropy": "entropy_loss",
                 "kl": "kl", "clip_ratio/region_mean": "ppo_clip_ratio",
                 "completions/mean_length": "response_length"},
}


def curves(framework: str, fault: str | None) -> dict[int, dict[str, float]]:
    names = RENAME[framework]
    return {step: {names[k]: v for k, v in row.items() if k in names}
            for step, row in trl_curves(fault=fault, at=25).items()}


def write_verl(path: Path, rows: dict[int, dict[str, float]],
               monkeypatch: pytest.MonkeyPatch) -> Path:
    from verl.utils.tracking import Tracking

    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(path))
    tracking = Tracking("diagnose", path.stem, default_backend=["file"])
    for step, values in rows.items():
        tracking.log(values, step=step)
    tracking.finish()
    return path


def write_openrlhf(directory: Path, rows: dict[int, dict[str, float]]) -> Path:
    from openrlhf.utils.logging_utils import TensorboardLogger

    args = SimpleNamespace(logger=SimpleNamespace(tensorboard_dir=str(directory),
                                                  wandb=SimpleNamespace(run_name="ppo")))
    logger = TensorboardLogger(args)
    for step, values in rows.items():
        logger.log_train(step, values)
    logger.close()
    return directory / "ppo"


@pytest.mark.parametrize("fault", ["entropy_collapse", "nan"])
def test_verl_file_logger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str) -> None:
    path = write_verl(tmp_path / "verl-run.jsonl", curves("verl", fault), monkeypatch)
    (run,), problems = read_paths([path])
    assert problems == [] and run.format == "verl-file-logger" and run.steps == 40
    d = diagnose(run)
    assert (d.keymap.framework, d.keymap.how) == ("verl", "written by the framework's own logger")
    first = fired(d.findings)
    if fault == "nan":
        assert math.isnan(run.rows[25]["actor/pg_loss"])  # orjson wrote null
        assert any("null" in note for note in run.notes)
        assert first["NonFiniteMetric"] == 25
    else:
        assert first["EntropyCollapse"] == 27
        collapse = next(f for f in d.findings if f.alert == "EntropyCollapse")
        assert collapse.key == "actor/entropy"


def test_verl_healthy_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_verl(tmp_path / "verl-run.jsonl", curves("verl", None), monkeypatch)
    (run,), _ = read_paths([path])
    assert diagnose(run).worst() != "critical"


@pytest.mark.parametrize("fault", ["entropy_collapse", "nan"])
def test_openrlhf_tensorboard_logger(tmp_path: Path, fault: str) -> None:
    run_dir = write_openrlhf(tmp_path, curves("openrlhf", fault))
    (run,), problems = read_paths([tmp_path])
    assert problems == [] and run.source == str(run_dir) and run.steps == 40
    d = diagnose(run)
    assert d.keymap.framework == "openrlhf"
    entropy = next(k for k in d.keymap.keys if k.key == "train/entropy_loss")
    assert entropy.name == "actor/entropy" and entropy.lossy  # window-normalized in OpenRLHF
    first = fired(d.findings)
    assert first["EntropyCollapse" if fault == "entropy_collapse" else "NonFiniteMetric"] == (
        27 if fault == "entropy_collapse" else 25)
    if fault == "entropy_collapse":
        collapse = next(f for f in d.findings if f.alert == "EntropyCollapse")
        assert collapse.lossy and "not comparable" in collapse.value_is
