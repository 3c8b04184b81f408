"""W&B runs written by W&B itself (in a child process, offline) give diagnose its step times."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlmon.service.diagnose.findings import diagnose
from rlmon.service.diagnose.formats import read_paths
from tests.service.diagnose.test_diagnose_wandb import write_wandb
from tests.unit.diagnose.test_diagnose_cost import _sliding_entropy


def test_wandb_timestamps_give_the_step_times(tmp_path: Path) -> None:
    runs = write_wandb(tmp_path, {"timed": _sliding_entropy(40)})
    (run,), problems = read_paths([runs["timed"]])
    assert problems == []
    d = diagnose(run, gpus=2)
    assert d.clock is not None and d.clock.how == "W&B _timestamp"
    stamps = [values["_timestamp"] for values in run.rows.values()]
    spent = max(stamps) - min(stamps)
    assert d.clock.total_seconds == pytest.approx(spent + d.clock.seconds_per_step)
    assert d.clock.gpu_hours(d.clock.total_seconds) == pytest.approx(
        d.clock.total_seconds * 2 / 3600)
    assert any(p.target.metric == "actor/entropy" for p in d.projections)
