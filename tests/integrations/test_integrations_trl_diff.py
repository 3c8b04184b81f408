"""``rlmon diff`` on two real TRL GRPOTrainer runs (CPU, the tests' tiny local model) that differ
only in their learning rate: each leaves TensorBoard events (with the Trainer's arguments as a
text summary), ``trainer_state.json`` and ``training_args.bin``; the diff reports the
``learning_rate`` setting, the learning-rate curve that differs exactly from the first step, and
where the runs' metrics part ways. No rlmon code runs during training."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rlmon.cli import main
from tests.support.extras import optional_import

pytestmark = [pytest.mark.trl, pytest.mark.slow, pytest.mark.timeout(1200)]

optional_import("torch")
optional_import("trl")
optional_import("tensorboard")

from tests.support.trl_support import grpo_trainer  # noqa: E402

STEPS = 20
RATES = (1e-5, 1e-3)


def _reward(completions: list[Any], **_: Any) -> list[float]:
    texts = [c if isinstance(c, str) else str(c) for c in completions]
    return [t.count("cat") + 0.1 * len(t.split()) for t in texts]


def _train(out: Path, lr: float) -> Path:
    trainer = grpo_trainer(out, _reward, max_steps=STEPS, beta=0.04, learning_rate=lr,
                           report_to=["tensorboard"], run_name=out.name)
    trainer.train()
    trainer.save_state()
    trainer.save_model()  # with training_args.bin
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    slow, fast = (_train(tmp_path_factory.mktemp(f"trl-lr-{lr:g}"), lr) for lr in RATES)
    return slow, fast


def test_two_learning_rates_are_told_apart(runs: tuple[Path, Path],
                                           capsys: pytest.CaptureFixture[str]) -> None:
    slow, fast = runs
    assert main(["diff", str(slow), str(fast)]) == 0
    printed = capsys.readouterr()
    with capsys.disabled():  # shown as printed (docs/diff.md quotes it)
        print(f"\n$ rlmon diff {slow.name} {fast.name}\n{printed.out}")
    assert "settings that differ (A -> B):" in printed.out
    assert f"learning_rate: {RATES[0]:g} -> {RATES[1]:g}" in printed.out
    assert "differs exactly: actor/lr" in printed.out
    assert main(["diff", str(slow), str(fast), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {"key": "learning_rate", "a": RATES[0], "b": RATES[1]} in data["settings"]
    assert not any(s["key"] == "output_dir" for s in data["settings"])
    lr = next(m for m in data["metrics"] if m["metric"] == "actor/lr")
    assert lr["diverged"] and lr["exact"] and lr["onset"] == 1


def test_a_run_against_its_own_files_does_not_part(runs: tuple[Path, Path],
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    slow, _ = runs
    events = next((slow / "runs").iterdir())
    assert main(["diff", str(slow / "trainer_state.json"), str(events), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["diverged"] is False and not any(m["diverged"] for m in data["metrics"])
