"""Faults with real Ray: the aggregator killed mid-run, a worker rank killed, a slow rank."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rlmon.actors.reporter import Reporter
from rlmon.actors.runtime import (
    RuntimeOptions,
    aggregator_name,
    ensure_runtime,
    shutdown_runtime,
)
from rlmon.service.metrics import catalog
from tests.support.polling import PATIENCE_S, wait_for

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def _steps(ray: Any, service: Any, run: str, n: int) -> list[dict[str, Any]]:
    def got() -> list[dict[str, Any]] | None:
        steps: list[dict[str, Any]] = ray.get(service.steps.remote(run))
        return steps if len(steps) >= n else None

    return wait_for(got, PATIENCE_S, "steps in the history store")


def test_aggregator_killed_mid_run_loses_and_double_counts_nothing(
    ray_cluster: Any, ray_namespace: str, tmp_path: Path
) -> None:
    ray = ray_cluster
    opts = RuntimeOptions(state_dir=str(tmp_path), deadline_s=60.0)
    service = ensure_runtime(ray_namespace, opts)
    reps = [Reporter("run", "actor", rank={"dp": d}, world={"dp": 2}, namespace=ray_namespace,
                     runtime=opts, step_seconds=False) for d in range(2)]

    def step(s: int, ranks: list[Reporter]) -> None:
        for rep in ranks:
            rep.record("rollout/tokens", sum=float(rep.rank.dp + 1))
            rep.record("actor/loss", sum=float(s), count=1.0)
            rep.end_step(s)

    for s in range(4):
        step(s, reps)
    step(4, reps[:1])  # step 4 is half open when the aggregator dies
    assert all(rep.flush(PATIENCE_S) for rep in reps)
    agg = ray.get_actor(aggregator_name(0), namespace=ray_namespace)
    before = ray.get(agg.stats.remote()).incarnation
    ray.kill(agg, no_restart=False)  # Ray restarts it (max_restarts=-1)

    def restarted() -> bool:
        try:
            return bool(ray.get(agg.stats.remote(), timeout=5).incarnation != before)
        except Exception:  # unavailable while it restarts
            return False

    wait_for(restarted, PATIENCE_S, "the aggregator to restart")
    step(4, reps[1:])
    for s in range(5, 8):
        step(s, reps)
    assert all(rep.flush(PATIENCE_S) for rep in reps)
    steps = _steps(ray, service, "run", 8)
    assert [s["step"] for s in steps] == list(range(8))  # none lost, none twice
    assert all(s["complete"] for s in steps)
    assert all(s["metrics"]["rollout/tokens"] == 3.0 for s in steps)  # 1 + 2, never 4 or 6
    assert [s["metrics"]["actor/loss"] for s in steps] == [float(s) for s in range(8)]
    assert reps[0].resent >= 1  # rank 0 rebuilt the half-open step 4 in the new aggregator
    for rep in reps:
        rep.close()
    assert shutdown_runtime(ray_namespace)


def _worker(ray: Any) -> Any:
    @ray.remote(num_cpus=0, max_restarts=0)
    class Worker:
        def __init__(self, namespace: str, dp: int, world: int, opts: RuntimeOptions) -> None:
            self.rep = Reporter("run", "actor", rank={"dp": dp}, world={"dp": world},
                                namespace=namespace, runtime=opts, step_seconds=False)
            self.dp = dp

        def ready(self) -> bool:
            return True

        def step(self, step: int, compute_s: float = 0.0) -> None:
            # the step's duration is given, not slept and measured: what the product derives from
            # it must not depend on how loaded the machine running the test is
            self.rep.record("rollout/tokens", sum=float(10 ** self.dp))
            self.rep.record(catalog.STRAGGLER_SOURCE, max=compute_s)
            self.rep.end_step(step)

        def flush(self) -> bool:
            return self.rep.flush(PATIENCE_S)

    return Worker


def test_killed_rank_finalizes_at_deadline_with_rank_missing(
    ray_cluster: Any, ray_namespace: str, tmp_path: Path
) -> None:
    """Steps 2 and 3 wait their deadline for the killed rank. Steps 0 and 1 must complete before
    theirs: both workers are up before step 0, each step is flushed by both, and the deadline
    (from a step's first report) is long enough for a loaded machine to deliver the second
    rank's report (which it does within milliseconds unloaded; 30 s costs this test 30 s)."""
    ray = ray_cluster
    opts = RuntimeOptions(state_dir=str(tmp_path), deadline_s=30.0)
    service = ensure_runtime(ray_namespace, opts)
    Worker = _worker(ray)
    workers = [Worker.remote(ray_namespace, d, 2, opts) for d in range(2)]
    assert all(ray.get([w.ready.remote() for w in workers]))
    for s in range(2):
        ray.get([w.step.remote(s) for w in workers])
        assert all(ray.get([w.flush.remote() for w in workers]))
    ray.kill(workers[1], no_restart=True)
    for s in range(2, 4):
        ray.get(workers[0].step.remote(s))
    assert ray.get(workers[0].flush.remote())
    steps = _steps(ray, service, "run", 4)
    assert [s["complete"] for s in steps] == [True, True, False, False]
    assert steps[2]["missing_ranks"] == [{"dp": 1, "cp": 0, "tp": 0, "pp": 0}]
    # the dead rank's last value (10) is not carried into later steps
    assert [s["metrics"]["rollout/tokens"] for s in steps] == [11.0, 11.0, 1.0, 1.0]
    alerts = ray.get(service.alerts.remote("run"))
    assert any(a["alert"] == "RankMissing" and a["state"] == "firing" and a["step"] == 2
               for a in alerts)
    ray.kill(workers[0])
    assert shutdown_runtime(ray_namespace)


def test_slow_rank_shows_as_straggler(
    ray_cluster: Any, ray_namespace: str, tmp_path: Path
) -> None:
    ray = ray_cluster
    opts = RuntimeOptions(state_dir=str(tmp_path), deadline_s=30.0)
    service = ensure_runtime(ray_namespace, opts)
    Worker = _worker(ray)
    workers = [Worker.remote(ray_namespace, d, 3, opts) for d in range(3)]
    for s in range(2):
        ray.get([w.step.remote(s, 0.4 if d == 2 else 0.05) for d, w in enumerate(workers)])
    assert all(ray.get([w.flush.remote() for w in workers]))
    steps = _steps(ray, service, "run", 2)
    for s in steps:
        assert s["complete"]
        assert s["metrics"][catalog.STRAGGLER_SOURCE] == 0.4  # the slowest rank's
        assert s["metrics"][catalog.STRAGGLER_METRIC] == pytest.approx(8.0)  # 0.4 s / median 0.05
    for w in workers:
        ray.kill(w)
    assert shutdown_runtime(ray_namespace)
