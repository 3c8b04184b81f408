"""A script joins a running service the way ``rlmon serve`` prints (issue 25): the environment
it prints reaches this Ray, and the script's Reporter says once which service it reports to
(the Ray's address, the namespace, the run page), so a run never lands in someone else's rlmon
without a word."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rlmon.actors.runtime import RuntimeOptions, ensure_runtime, shutdown_runtime
from rlmon.commands.serve import ray_join_env
from tests.support.polling import CHILD_RUN_S, PATIENCE_S, wait_for

pytestmark = pytest.mark.ray

SCRIPT = """
import sys
from rlmon import Reporter
rep = Reporter(run="joined", role="actor", namespace=sys.argv[1])
for step in range(3):
    rep.record("actor/loss", sum=1.0, count=1.0)
    rep.end_step(step)
rep.close()
"""


def test_a_script_with_the_printed_environment_reports_here_and_says_so(
        ray_cluster: Any, ray_namespace: str, tmp_path: Path) -> None:
    service = ensure_runtime(ray_namespace, RuntimeOptions(
        state_dir=str(tmp_path / "state"), port=0, host="127.0.0.1", deadline_s=1.0))
    try:
        layout = ray_cluster.get(service.layout.remote())
        gcs = ray_cluster.get_runtime_context().gcs_address
        words = dict(w.split("=", 1) for w in ray_join_env().split())
        assert words["RAY_ADDRESS"] == gcs
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RLMON_", "RAY_ADDR"))}
        env.update(words)
        script = tmp_path / "train.py"
        script.write_text(SCRIPT)
        done = subprocess.run([sys.executable, str(script), ray_namespace], env=env,
                              capture_output=True, text=True, timeout=CHILD_RUN_S,
                              stdin=subprocess.DEVNULL)
        assert done.returncode == 0, done.stderr[-3000:]
        said = [line for line in done.stderr.splitlines()
                if line.startswith("rlmon: reporting to the rlmon service")]
        assert said == [
            f"rlmon: reporting to the rlmon service in namespace {ray_namespace!r} on the Ray at "
            f"{gcs}: the run page on http://127.0.0.1:{layout['port']}/; state in "
            f"{tmp_path / 'state'}"]
        wait_for(lambda: len(ray_cluster.get(service.steps.remote("joined"))) == 3, PATIENCE_S,
                 f"the script's steps at this service; its stderr: {done.stderr[-2000:]}")
    finally:
        shutdown_runtime(ray_namespace)
