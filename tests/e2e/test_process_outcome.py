"""A driver that dies because a Ray rank actor raised says the actor's exception in its closing
heartbeat (issue 29): the type names both (``RayTaskError(ValueError)``), the message is the
actor's, and the heartbeat names the driver's Ray node and job. A real Ray, a real actor, the
driver run as a user runs it; its heartbeats written as the aggregator's edge check accepts them
(tests/support/outcome_child.py's sink)."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from tests.e2e.test_first_hour import _ray_processes_under
from tests.support.paths import REPO
from tests.support.subprocesses import run_in_own_session

pytestmark = [pytest.mark.ray, pytest.mark.slow]

DRIVER = """
import sys
sys.path.insert(0, {repo!r})
from rlmon.actors.reporter import Reporter
from tests.support.outcome_child import FileBeatSink

rep = Reporter("ray-driver", "actor", rank={{"dp": 0}}, world={{"dp": 1}},
               sink=FileBeatSink({beats!r}), hardware_interval=None, heartbeat_seconds=0.05)
import ray  # after the Reporter: Ray's excepthook wraps rlmon's

ray.init(include_dashboard=False, num_cpus=1)


@ray.remote
class Rank:
    def train(self, step):
        if step == 2:
            raise ValueError("reward model returned NaN at step 2")
        return step


rank = Rank.remote()
for step in range(5):
    ray.get(rank.train.remote(step))
    rep.record("actor/loss", sum=1.0, count=1.0)
    rep.end_step(step)
"""


def test_a_driver_killed_by_a_rank_actors_exception_names_it(tmp_path: Path) -> None:
    ray_tmp = Path(tempfile.mkdtemp(prefix="ro-", dir="/tmp"))  # Ray's socket paths are short
    beats_path = tmp_path / "beats.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RLMON_", "RAY_ADDRESS"))}
    env.update(RAY_TMPDIR=str(ray_tmp), RAY_DISABLE_USAGE_STATS="1", RAY_AUTH_MODE="disabled",
               RLMON_EXIT_TIMEOUT="20")
    try:
        done = run_in_own_session(
            [sys.executable, "-c", DRIVER.format(repo=str(REPO), beats=str(beats_path))],
            timeout=240, env=env, cwd=tmp_path)
        assert _ray_processes_under(ray_tmp) == []
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert done.returncode == 1, done.stderr[-3000:]
    beats = [json.loads(line) for line in beats_path.read_text().splitlines()]
    closing = beats[-1]
    assert closing["closing"] and sum(b["closing"] for b in beats) == 1, beats[-3:]
    said = closing["outcome"]
    assert said is not None, done.stderr[-3000:]
    assert said["kind"] == "exception"
    assert said["exc_type"] == "ray.exceptions.RayTaskError(ValueError)"
    assert said["message"] == "reward model returned NaN at step 2"
    assert any(" in train" in frame for frame in said["frames"]), said["frames"]
    assert [b["ranks"][0]["last_step"] for b in beats][-1] == 1  # the steps before the raise
    process = closing["process"]
    assert process["pid"] > 0 and process["node_id"] and process["job_id"], process
    assert process["worker_id"] and not process["actor_id"], process  # the driver, not an actor
