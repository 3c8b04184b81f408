"""examples/trl_grpo.py, the TRL snippet of docs/integrations.md, run as a user runs it (a
subprocess, rlmon on a local Ray it starts), with a reward of zero: every step must reach rlmon's
aggregator, and the service's ``NoLearningSignal`` alert must print on the console of the script
that started it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.support.extras import optional_import
from tests.support.paths import REPO
from tests.support.subprocesses import run_in_own_session

pytestmark = [pytest.mark.trl, pytest.mark.examples, pytest.mark.ray]

ROOT = REPO


def test_the_example_reports_every_step_and_alerts_on_the_console(tmp_path: Path) -> None:
    optional_import("trl")
    optional_import("ray")
    env = {**os.environ, "RLMON_NAMESPACE": f"trl-example-{os.getpid()}",
           "RLMON_STATE_DIR": str(tmp_path / "state"), "RAY_DISABLE_USAGE_STATS": "1",
           "RAY_AUTH_MODE": "disabled", "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"}
    env.pop("RLMON_SINK_JSONL", None)
    for key in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(key, None)  # a single-process run, whatever launcher variables this process has
    proc = run_in_own_session(
        [sys.executable, "examples/trl_grpo.py", "--steps", "6", "--zero-reward",
         "--run", "trl-example"], timeout=400, cwd=ROOT, env=env)
    out, err = proc.stdout, proc.stderr
    assert proc.returncode == 0, err[-4000:]
    # flush() returned True: the aggregator acknowledged all six steps
    assert "rlmon: 6 steps of run 'trl-example' delivered" in out, out + err[-2000:]
    alerts = [line for line in err.splitlines() if "NoLearningSignal" in line]
    assert alerts and "trl-example/trainer step 5" in alerts[0], err[-4000:]
    assert "rollout/frac_reward_zero_std = 1" in alerts[0]
