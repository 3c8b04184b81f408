"""A script that falls off its end straight after its last ``end_step`` (no ``flush``, no
``close``) still delivers every step, within its exit budget (issue 23, first hour).

Ray was first imported by the exit flush, after the interpreter's shutdown had begun, where
threading refuses the exit hook ``concurrent.futures.thread`` registers on import: ``import ray``
failed with "can't register atexit after shutdown", retried until ``RLMON_EXIT_TIMEOUT``, and
every step was lost.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest

from rlmon.service.storage.history import HistoryStore
from tests.support.subprocesses import run_in_own_session

pytestmark = [pytest.mark.ray, pytest.mark.slow]

SCRIPT = """
from rlmon import Reporter
rep = Reporter("falls-off", "actor")
for step in range(5):
    rep.record("actor/loss", sum=1.0, count=1.0)
    rep.end_step(step)
"""

BUDGET_S = 60.0


def test_a_script_without_flush_or_close_delivers_its_steps_at_exit(tmp_path: Path) -> None:
    # Ray's socket paths are length-limited: a short temp dir of the test's own
    ray_tmp = Path(tempfile.mkdtemp(prefix="rx-", dir="/tmp"))
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RLMON_", "RAY_ADDRESS"))}
    env.update(RAY_TMPDIR=str(ray_tmp), RLMON_STATE_DIR=str(tmp_path / "state"), RLMON_PORT="0",
               RAY_DISABLE_USAGE_STATS="1", RAY_AUTH_MODE="disabled",
               RLMON_EXIT_TIMEOUT=f"{BUDGET_S:g}")
    started = time.monotonic()
    try:
        done = run_in_own_session([sys.executable, str(script)], timeout=240, env=env)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr[-3000:]
    assert "can't register atexit" not in done.stderr, done.stderr[-3000:]
    history = HistoryStore(tmp_path / "state" / "history.sqlite")
    try:
        steps = [s["step"] for s in history.steps("falls-off", "actor")]
    finally:
        history.close()
    assert steps == [0, 1, 2, 3, 4], done.stderr[-3000:]
    assert took < BUDGET_S, f"the script took {took:.0f}s with an exit budget of {BUDGET_S:g}s"
