"""``rlmon diagnose`` on Hugging Face checkpoints written by transformers' own writers: each
``checkpoint-<step>`` holds ``trainer_state.json`` (``TrainerState.save_to_json``) and
``training_args.bin`` (``torch.save`` of the ``TrainingArguments``, as ``Trainer._save`` writes
it). The arguments are read without unpickling them; a run resumed from checkpoint-20 with four
times the gradient accumulation whose loss falls by four at step 21 shows the 1/GA signature, a
resumed run whose loss goes on as before does not.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from rlmon.service.diagnose.findings import diagnose
from rlmon.service.diagnose.formats import read_paths
from tests.support.extras import optional_import

pytestmark = [pytest.mark.torch]

optional_import("torch")
optional_import("transformers")


def _checkpoints(out: Path, loss_factor: float) -> Path:
    import torch
    from transformers import TrainerState, TrainingArguments

    rng = random.Random(0)
    history = []
    for step in range(1, 41):
        loss = 2.0 - 0.01 * step + 0.02 * rng.gauss(0, 1)
        history.append({"loss": loss * (loss_factor if step > 20 else 1.0),
                        "grad_norm": 1.0 + 0.05 * rng.random(),
                        "learning_rate": 2e-5, "epoch": step / 40, "step": step})
    for step, ga in ((10, 1), (20, 1), (30, 4), (40, 4)):
        folder = out / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        args = TrainingArguments(output_dir=str(out), gradient_accumulation_steps=ga,
                                 per_device_train_batch_size=8, report_to=[], use_cpu=True)
        torch.save(args, folder / "training_args.bin")
        TrainerState(global_step=step, max_steps=40,
                     log_history=[h for h in history if h["step"] <= step]).save_to_json(
            str(folder / "trainer_state.json"))
    return out


def test_a_resume_with_four_times_the_ga_and_a_quarter_of_the_loss(tmp_path: Path) -> None:
    (run,), problems = read_paths([_checkpoints(tmp_path / "faulty", 0.25)])
    assert problems == [] and run.source.endswith("checkpoint-40/trainer_state.json")
    assert [(s.first_step, s.settings.gradient_accumulation_steps,
             s.settings.per_device_batch_size) for s in run.segments] == [(1, 1, 8), (21, 4, 8)]
    assert any("placed at the step after the checkpoint" in n for n in run.notes)
    found = [(f.alert, f.step, f.key) for f in diagnose(run).findings
             if f.alert == "ScaledByGradAccumulation"]
    assert found == [("ScaledByGradAccumulation", 21, "loss")]


def test_a_resume_with_a_continuous_loss_gives_no_finding(tmp_path: Path) -> None:
    (run,), problems = read_paths([_checkpoints(tmp_path / "healthy", 1.0)])
    assert problems == [] and len(run.segments) == 2
    assert not [f for f in diagnose(run).findings if f.source == "sanity"]
