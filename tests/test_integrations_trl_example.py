"""examples/trl_grpo.py, the README's TRL snippet, run as a user runs it (a subprocess)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from extras import optional_import

from rlmon.service import keymaps
from rlmon.service.replay import replay

pytestmark = [pytest.mark.trl, pytest.mark.examples]

ROOT = Path(__file__).resolve().parents[1]


def test_the_example_runs_and_rlmon_receives_every_step(tmp_path: Path) -> None:
    optional_import("trl")
    sink = tmp_path / "run.jsonl"
    env = {**os.environ, "RLMON_SINK_JSONL": str(sink)}  # a file instead of Ray, for replay
    proc = subprocess.run([sys.executable, "examples/trl_grpo.py", "--steps", "3"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "rlmon: 3 steps of run 'trl-tiny' delivered" in proc.stdout
    result = replay(sink.read_text().splitlines())
    assert not result.errors
    steps = {rec.step: rec.metrics for rec, _ in result.steps}
    assert sorted(steps) == [1, 2, 3]
    for step, metrics in steps.items():
        assert {keymaps.KL, keymaps.ENTROPY, keymaps.CLIP_RATIO, keymaps.LR} <= set(metrics)
        assert (keymaps.REWARD in metrics) == (step % 2 == 1)  # num_iterations=2
