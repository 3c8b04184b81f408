"""``rlmon diff`` of a W&B run written by W&B itself (in a child process, offline) and a stored run."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlmon.cli import main
from tests.service.diagnose.test_diagnose_settings import write_wandb


def test_diff_of_a_wandb_run_and_a_stored_run(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    from rlmon.service.contract.step_record import StepRecord
    from rlmon.service.storage.history import HistoryStore

    wandb_dir = write_wandb(tmp_path, "verl-run", 1.0)
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    store = HistoryStore(state_dir / "history.sqlite")
    try:  # the W&B run's entropy and grad norm, then a collapse
        store.add([StepRecord("stored", "driver", step, True, 1, 1, (),
                              {"actor/entropy": 1.5 - 0.01 * step if step < 12 else 0.05,
                               "actor/grad_norm": 0.55 + 0.01 * (step % 3)})
                   for step in range(1, 21)])
    finally:
        store.close()
    assert main(["diff", str(wandb_dir), "stored", "--state-dir", str(state_dir),
                 "--persist", "3"]) == 0
    out = capsys.readouterr().out
    assert "B: stored (rlmon-history, run stored, 20 steps)" in out
    # the W&B run's entropy is a noiseless line (so is the stored one until it collapses)
    assert "differs exactly: actor/entropy: differs from step 12 (1.38 vs 0.05" in out
    assert "within noise: actor/grad_norm" in out
    assert "settings: not recorded in stored" in out
    assert main(["diff", str(wandb_dir), "no-such-run", "--state-dir", str(state_dir)]) == 2
    assert "no run 'no-such-run'" in capsys.readouterr().err
