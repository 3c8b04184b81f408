"""``rlmon diagnose`` on the files a real TRL GRPOTrainer run leaves behind (CPU, the tiny local
model): TensorBoard event files from the Hugging Face TensorBoard callback, a W&B offline run from
its W&B callback (``WANDB_MODE=offline``, no network) and ``trainer_state.json`` from
``Trainer.save_state``. No rlmon code runs during training.

Faults are injected into the run itself: the reward function ties every group's rewards at
steps 6-8 (``NoLearningSignal`` at 8); a callback multiplies the final norm's weight by 10,000
after step 12, so the policy turns deterministic (its entropy 0 from step 13, ``EntropyCollapse``
at 15); and after step 16 it overwrites the reference model's final norm with NaN, as a corrupt
reference checkpoint would: the KL is NaN at step 17, so are the loss and the gradients, and
``NonFiniteMetric`` fires at 17 on the gradient norm. TRL logs a metric whose every value was NaN
as None (``kl`` here), which the files keep as a missing key: ``MetricNotLogged`` says so. A
healthy run of the same trainer gives no critical finding. A DPOTrainer run at learning rate 0
(the policy stays the reference) has its loss stuck at ln 2: the sanity layer's ``DPOLossAtLn2``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from rlmon.service.diagnose.findings import diagnose
from rlmon.service.diagnose.formats import read_paths
from tests.support.diagnose_support import fired
from tests.support.extras import optional_import

pytestmark = [pytest.mark.trl, pytest.mark.slow]

optional_import("torch")
optional_import("trl")
optional_import("tensorboard")
optional_import("wandb")

from tests.support.trl_support import grpo_trainer  # noqa: E402

TIES = range(6, 9)
COLLAPSE_AFTER = 12
NAN_AT = 17


def _reward(faulty: bool) -> Any:
    def reward(completions: list[Any], trainer_state: Any, **_: Any) -> list[float]:
        step = trainer_state.global_step + 1
        texts = [c if isinstance(c, str) else str(c) for c in completions]
        if faulty and step in TIES:
            return [1.0] * len(texts)
        return [t.count("cat") + 0.1 * len(t.split()) for t in texts]

    return reward


def _train(out: Path, faulty: bool, steps: int, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch
    from transformers import TrainerCallback

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(out))
    trainer = grpo_trainer(out, _reward(faulty), max_steps=steps, beta=0.04,
                           report_to=["tensorboard", "wandb"], run_name=out.name)

    class Faults(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            if not faulty:
                return
            with torch.no_grad():
                if state.global_step == COLLAPSE_AFTER:
                    trainer.model.model.norm.weight.mul_(1e4)
                if state.global_step == NAN_AT - 1:
                    trainer.ref_model.model.norm.weight.fill_(math.nan)

    trainer.add_callback(Faults())
    trainer.train()
    trainer.save_state()
    trainer.save_model()  # with training_args.bin, as a checkpoint has it
    import wandb

    wandb.finish()  # the job's exit would: the Hugging Face callback leaves the run open
    wandb.teardown()  # the next run reads WANDB_DIR afresh (W&B keeps its settings per process)


@pytest.fixture(scope="module")
def faulty(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("trl-faulty")
    with pytest.MonkeyPatch.context() as mp:
        _train(out, True, NAN_AT, mp)
    return out


def _by_format(out: Path) -> dict[str, Any]:
    runs, problems = read_paths([out])
    assert problems == []
    return {run.format: run for run in runs}


def test_the_faults_are_found_at_their_steps_in_every_file(faulty: Path) -> None:
    runs = _by_format(faulty)
    assert sorted(runs) == ["hf-trainer-state", "tensorboard", "wandb-offline"]
    for fmt, run in runs.items():
        d = diagnose(run)
        assert d.keymap.framework == "trl", fmt
        first = fired(d.findings)
        assert first["NoLearningSignal"] == TIES[-1], (fmt, first)
        assert first["EntropyCollapse"] == COLLAPSE_AFTER + 3, (fmt, first)
        assert first.get("NonFiniteMetric") == NAN_AT, (fmt, first)
        collapse = next(f for f in d.findings if f.alert == "EntropyCollapse")
        assert collapse.since == COLLAPSE_AFTER + 1 and collapse.lossy
        nan = next(f for f in d.findings if f.alert == "NonFiniteMetric")
        assert nan.metric == "actor/grad_norm" and math.isnan(nan.value or 0.0), nan
        assert [s for s, _ in next(r for r in nan.related if r.metric == "actor/lr").values] \
            == list(range(NAN_AT - 3, NAN_AT + 1))
        gap = next(f for f in d.findings if f.alert == "MetricNotLogged")
        assert (gap.step, gap.metric) == (NAN_AT, "actor/kl"), gap
    import deepspeed

    # W&B keeps the job's requirements: the sanity layer knows the DeepSpeed of the run
    assert runs["wandb-offline"].packages["deepspeed"] == deepspeed.__version__


def test_the_run_settings_are_read_from_every_file(faulty: Path) -> None:
    """The Trainer's arguments: the TensorBoard callback's ``args`` text, the W&B callback's
    config, the ``training_args.bin`` beside ``trainer_state.json`` (read without unpickling)."""
    for fmt, run in _by_format(faulty).items():
        settings = run.settings
        assert (settings.gradient_accumulation_steps, settings.per_device_batch_size,
                settings.deepspeed) == (1, 8, False), (fmt, settings)
        assert len(run.segments) == 1, fmt
        assert not [f for f in diagnose(run).findings
                    if f.alert in ("ScaledByGradAccumulation", "TokensOverCounted")], fmt


def test_a_healthy_run_gives_no_critical_finding(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    _train(tmp_path, False, 12, monkeypatch)
    runs = _by_format(tmp_path)
    assert len(runs) == 3
    for fmt, run in runs.items():
        d = diagnose(run)
        assert d.worst() != "critical", (fmt, [f for f in d.findings if f.state == "firing"])
        assert run.steps >= 12, fmt


def test_a_dpo_loss_stuck_at_ln2(tmp_path: Path) -> None:
    import random

    from datasets import Dataset
    from transformers import PreTrainedTokenizerFast
    from trl import DPOConfig, DPOTrainer

    from tests.support.trl_support import WORDS, tiny_model

    model_dir, tok_dir = tiny_model()
    rng = random.Random(0)
    pairs = [{"prompt": " ".join(rng.choice(WORDS) for _ in range(3)), "chosen": "cat cat",
              "rejected": "dog"} for _ in range(32)]
    args = DPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to=[],
                     per_device_train_batch_size=4, logging_steps=1, save_strategy="no",
                     max_steps=8, learning_rate=0.0, disable_tqdm=True, seed=0)
    trainer = DPOTrainer(model=str(model_dir), args=args, train_dataset=Dataset.from_list(pairs),
                         processing_class=PreTrainedTokenizerFast.from_pretrained(tok_dir))
    trainer.train()
    trainer.save_state()
    (run,), problems = read_paths([tmp_path / "trainer_state.json"])
    assert problems == []
    found = [f for f in diagnose(run).findings if f.alert == "DPOLossAtLn2"]
    assert [(f.step, f.key, f.source) for f in found] == [(5, "loss", "sanity")]

