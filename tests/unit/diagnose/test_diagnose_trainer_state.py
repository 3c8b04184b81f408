"""A Hugging Face ``trainer_state.json`` written by transformers' own TrainerState (the Trainer
saves it so; the tiny TRL run's is tested in tests/integrations/test_integrations_trl_diagnose.py)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from rlmon.service.diagnose.findings import diagnose
from rlmon.service.diagnose.formats import read_paths
from tests.support.diagnose_support import FAULT_ALERT, fired, trl_curves


def write_state(path: Path, rows: dict[int, dict[str, float]]) -> Path:
    from transformers import TrainerState

    history = [{**values, "step": step} for step, values in rows.items()]
    history.append({"train_runtime": 12.5, "train_loss": 0.1, "epoch": 1.0, "step": max(rows)})
    state = TrainerState(global_step=max(rows), max_steps=max(rows), log_history=history)
    path.parent.mkdir(parents=True, exist_ok=True)
    state.save_to_json(str(path))
    return path


@pytest.mark.parametrize("fault", sorted(FAULT_ALERT))
def test_a_fault_is_found_at_its_step(tmp_path: Path, fault: str) -> None:
    write_state(tmp_path / "out" / "trainer_state.json", trl_curves(fault=fault, at=25))
    (run,), problems = read_paths([tmp_path / "out"])
    assert problems == [] and run.format == "hf-trainer-state" and run.steps == 40
    d = diagnose(run)
    assert d.keymap.framework == "trl"
    alert, delay = FAULT_ALERT[fault]
    assert fired(d.findings)[alert] == 25 + delay
    if fault == "nan":
        assert math.isnan(run.rows[25]["loss"])  # json.dump's bare NaN token, read back


def test_only_the_latest_checkpoint_state_is_read(tmp_path: Path) -> None:
    curves = trl_curves(fault="tied_rewards", at=25)
    write_state(tmp_path / "out" / "checkpoint-20" / "trainer_state.json",
                {s: v for s, v in curves.items() if s <= 20})
    write_state(tmp_path / "out" / "checkpoint-40" / "trainer_state.json", curves)
    (run,), _ = read_paths([tmp_path / "out"])
    assert run.source.endswith("checkpoint-40/trainer_state.json")
    assert fired(diagnose(run).findings)["NoLearningSignal"] == 27


def test_bookkeeping_is_set_apart_and_unknown_keys_listed(tmp_path: Path) -> None:
    path = write_state(tmp_path / "trainer_state.json", trl_curves())
    (run,), _ = read_paths([path])
    d = diagnose(run)
    status = {k.key: k.status.value for k in d.keymap.keys}
    assert status["epoch"] == status["train_runtime"] == status["step"] == "bookkeeping"
    assert status["rewards/accuracy/mean"] == "unknown"
    assert status["entropy"] == "canonical"
    assert d.worst() != "critical"


def test_a_truncated_state_is_named(tmp_path: Path) -> None:
    """Read an entry at a time, a state cut short keeps the entries before the cut, as a
    truncated TensorBoard or W&B file does."""
    path = write_state(tmp_path / "trainer_state.json", trl_curves())
    text = path.read_text()
    path.write_text(text[:text.index('"step": 6') + 3])
    (run,), _ = read_paths([path])
    assert sorted(run.rows) == [1, 2, 3, 4, 5]
    (problem,) = run.problems
    assert problem.path == str(path) and "truncated" in problem.message
    path.write_text(text[:500])  # cut before the history: nothing to diagnose
    runs, (problem,) = read_paths([path])
    assert runs == [] and problem.path == str(path) and "truncated" in problem.message
