"""One Ray driver script for the tests of how a Ray run ends: the drivers of
tests/ray/test_ray_run_ends.py and the Ray Jobs of :mod:`tests.support.ray_jobs_child`.

``python driver.py MODE RUN NAMESPACE FLAG`` starts Ray, two rank actors (dp 0 and 1, each with
a Reporter of ``RUN``) that train up to :data:`STEPS` steps, says ``ready TIME PID1 PID0`` once
every step is delivered, then ends as ``MODE`` says. ``FLAG`` is a file: the test creates it to
let a waiting driver go on; the ``stopped`` job creates it itself once it waits for its stop.
:func:`driver_env` is the environment the tests' scripts join the session's Ray with, and
:func:`start_service` the service they report to.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tests.support.polling import with_patience

__all__ = ["RANKS_DRIVER", "driver_env", "start_service"]


def start_service(namespace: str, tmp: Path, config: str) -> Any:
    """The rlmon service of ``namespace`` with ``config`` (YAML, written to ``tmp``) and its state
    under ``tmp``: the service the tests' scripts report to."""
    from rlmon.actors.runtime import RuntimeOptions, ensure_runtime

    (tmp / "rlmon.yaml").write_text(config)
    return ensure_runtime(namespace, RuntimeOptions(config=str(tmp / "rlmon.yaml"),
                                                    state_dir=str(tmp / "state")))


def driver_env(address: str) -> dict[str, str]:
    """The environment of a script that joins the session's Ray at ``address``: none of this
    process's RLMON_ settings, heartbeats every 0.5 s (the liveness tests' thresholds are
    seconds) and a 30 s exit budget."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLMON_")}
    env.update(RAY_ADDRESS=address, RLMON_LIVENESS__HEARTBEAT_SECONDS="0.5",
               RLMON_EXIT_TIMEOUT="30", RAY_DISABLE_USAGE_STATS="1")
    return env


RANKS_DRIVER = with_patience("""
import os, sys, time
import ray
from rlmon import Reporter, watch_methods
mode, run, namespace, flag = sys.argv[1:5]
ray.init(namespace=namespace, log_to_driver=False)
STEPS = 8
options = {"resources": {"lost_node": 0.01}} if mode == "node" else {}

class Rank:
    def __init__(self, dp):
        self.rep = Reporter(run, "actor", rank={"dp": dp}, world={"dp": 2}, namespace=namespace,
                            hardware_interval=None, total_steps=STEPS)

    def pid(self):
        return os.getpid()

    def step(self, step, fail=False):
        with self.rep.span("train"):
            time.sleep(0.05)
            if fail:
                with self.rep.span("reward"):
                    raise ValueError("reward model returned NaN for every sample")
        self.rep.record("actor/loss", sum=1.0, count=1.0)
        self.rep.end_step(step)

    def save_checkpoint(self, seconds):
        with self.rep.span("save_checkpoint"):
            time.sleep(seconds)

    def flush(self):
        return self.rep.flush(PATIENCE_S)

cls = watch_methods(Rank) if mode == "raises_watched" else Rank
Remote = ray.remote(num_cpus=0, max_restarts=0, **options)(cls)
ranks = [Remote.remote(dp) for dp in (0, 1)]
pids = ray.get([r.pid.remote() for r in ranks])
failing = mode in ("raises", "raises_watched", "raises_lingers")
last = 5 if failing or mode in ("failed", "stopped") else STEPS - 1
for step in range(last + 1):
    ray.get([r.step.remote(step) for r in ranks])
assert all(ray.get([r.flush.remote() for r in ranks]))
print("ready", time.time(), pids[1], pids[0], flush=True)
if mode == "raises_lingers":  # a notebook's driver: the cell raised, the kernel and actors live on
    try:
        ray.get(ranks[1].step.remote(last + 1, fail=True))
    except ray.exceptions.RayTaskError:
        pass
    while not os.path.exists(flag):
        time.sleep(0.1)
elif failing:  # rank 1 raises at step 6: the driver's ray.get raises, it exits 1
    ray.get(ranks[1].step.remote(last + 1, fail=True))
elif mode == "failed":  # the driver's own failure: nothing of Ray's actors says it, the job does
    raise RuntimeError("the learner diverged: loss is NaN at step 5")
elif mode == "stopped":  # running until `ray job stop`
    open(flag, "w").close()
    while True:
        time.sleep(0.2)
elif mode in ("sigkill", "node"):  # the test kills rank 1's worker (or its node): the driver waits
    while not os.path.exists(flag):
        time.sleep(0.1)
    # a driver in a collective with the lost ranks waits until Ray declares their node dead
    while mode == "node" and any(n["Alive"] and n["Resources"].get("lost_node")
                                 for n in ray.nodes()):
        time.sleep(0.2)
    ray.get(ranks[1].step.remote(last + 1))  # raises RayActorError: exit 1
elif mode == "final_save":  # longer than the stall floor, after the last step
    ray.get([r.save_checkpoint.remote(8.0) for r in ranks])
elif mode == "released":  # its last handles released: Ray ends the actors gracefully
    del ranks
    while not os.path.exists(flag):
        time.sleep(0.1)
elif mode in ("kill", "kill_stays"):
    for r in ranks:
        ray.kill(r)
    if mode == "kill_stays":  # it stays for its own checkpoint, until the test lets it go
        print("killed", time.time(), flush=True)
        while not os.path.exists(flag):
            time.sleep(0.1)
print("ending", time.time(), flush=True)
""")
