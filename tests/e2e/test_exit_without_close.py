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
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from rlmon.service.storage.history import HistoryStore
from tests.e2e.test_first_hour import _ray_processes_under
from tests.support.polling import wait_for
from tests.support.subprocesses import run_in_own_session

pytestmark = [pytest.mark.ray, pytest.mark.slow]

SCRIPT = """
import time
from rlmon import Reporter
rep = Reporter("falls-off", "actor")
for step in range(5):
    rep.record("actor/loss", sum=1.0, count=1.0)
    rep.end_step(step)
print("loop done at", time.time(), flush=True)
"""

BUDGET_S = 60.0


def _run(tmp_path: Path, budget: float
         ) -> tuple[subprocess.CompletedProcess[str], float, float]:
    """The script, run as a user runs it with an exit budget; how long it took, and the wall
    time it ended at (taken as it ends: the wait for Ray's orphans after it is not its own)."""
    # Ray's socket paths are length-limited: a short temp dir of the test's own
    ray_tmp = Path(tempfile.mkdtemp(prefix="rx-", dir="/tmp"))
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RLMON_", "RAY_ADDRESS"))}
    env.update(RAY_TMPDIR=str(ray_tmp), RLMON_STATE_DIR=str(tmp_path / "state"), RLMON_PORT="0",
               RAY_DISABLE_USAGE_STATS="1", RAY_AUTH_MODE="disabled",
               RLMON_EXIT_TIMEOUT=f"{budget:g}")
    started = time.monotonic()
    try:
        done = run_in_own_session([sys.executable, str(script)], timeout=240, env=env)
        took, ended = time.monotonic() - started, time.time()
        # none left behind: a Ray still starting at the budget's end is orphaned with the
        # process, and its agents stop when they see their raylet gone (seconds, under load)
        wait_for(lambda: _ray_processes_under(ray_tmp) == [], 30, "Ray's processes to stop")
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    return done, took, ended


def test_a_script_without_flush_or_close_delivers_its_steps_at_exit(tmp_path: Path) -> None:
    done, took, _ = _run(tmp_path, BUDGET_S)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "can't register atexit" not in done.stderr, done.stderr[-3000:]
    history = HistoryStore(tmp_path / "state" / "history.sqlite")
    try:
        steps = [s["step"] for s in history.steps("falls-off", "actor")]
    finally:
        history.close()
    assert steps == [0, 1, 2, 3, 4], done.stderr[-3000:]
    assert took < BUDGET_S, f"the script took {took:.0f}s with an exit budget of {BUDGET_S:g}s"


def test_an_exit_budget_shorter_than_rays_start_up_is_kept_and_the_loss_said(
        tmp_path: Path) -> None:
    """With a budget too short for Ray's start-up, the process leaves at its budget (a sender
    still waiting for Ray gives up then, not after its join) and says what it did not deliver."""
    budget = 2.0
    done, _, exited = _run(tmp_path, budget)
    assert done.returncode == 0, done.stderr[-3000:]
    loop_done = float(done.stdout.split("loop done at ")[1].split()[0])
    assert exited - loop_done < budget + 4.0, done.stderr[-3000:]
    said = [line for line in done.stderr.splitlines() if line.startswith("rlmon: falls-off/")]
    assert said and said[0].startswith(
        "rlmon: falls-off/actor: could not start a local Ray of rlmon's own: no answer within "
        "the exit budget (RLMON_EXIT_TIMEOUT); this process's metrics are not delivered. Raise "
        "RLMON_EXIT_TIMEOUT, or call flush() before the script ends"), done.stderr[-3000:]
    # the loss is said once: by the close at the budget's end, or by the sender giving up
    # first, whichever counts it
    assert len([line for line in said if "5 step message(s) not" in line]) == 1, said
    assert len(said) <= 2, said
