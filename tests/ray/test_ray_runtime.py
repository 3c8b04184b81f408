"""The Ray runtime end to end: Reporters in Ray workers, the aggregator and service actors,
the exporter's /metrics, the history store, and a graceful shutdown."""

from __future__ import annotations

import urllib.request
from pathlib import Path
from typing import Any

import pytest

from rlmon.actors.runtime import RuntimeOptions, ensure_runtime, node_merger, shutdown_runtime
from rlmon.service.metrics import catalog
from tests.support.polling import PATIENCE_S, wait_for

pytestmark = pytest.mark.ray


def _worker_class(ray: Any) -> Any:
    @ray.remote(num_cpus=0)
    class Worker:
        def __init__(self, namespace: str, run: str, dp: int, world: int,
                     opts: RuntimeOptions) -> None:
            from rlmon.actors.reporter import Reporter

            self.rep = Reporter(run, "actor", rank={"dp": dp}, world={"dp": world},
                                namespace=namespace, runtime=opts)
            self.dp = dp

        def step(self, step: int, is_ratio: float) -> bool:
            self.rep.record("actor/is_ratio", sum=is_ratio * (self.dp + 1), count=self.dp + 1)
            self.rep.record("rollout/tokens", sum=10.0)
            self.rep.end_step(step)
            return True

        def flush(self) -> bool:
            return self.rep.flush(PATIENCE_S)

    return Worker


def test_reporters_in_workers_to_metrics_and_alert(ray_cluster: Any, ray_namespace: str,
                                                   tmp_path: Path) -> None:
    ray = ray_cluster
    opts = RuntimeOptions(state_dir=str(tmp_path), port=0)
    service = ensure_runtime(ray_namespace, opts)
    # get-if-exists: a second start finds the same actors
    assert ensure_runtime(ray_namespace, opts)._actor_id == service._actor_id
    port = ray.get(service.layout.remote())["port"]
    Worker = _worker_class(ray)
    workers = [Worker.remote(ray_namespace, "run1", dp, 2, opts) for dp in range(2)]
    for step in range(4):
        ratio = 1.0 if step < 2 else 3.0  # diverges at step 2
        ray.get([w.step.remote(step, ratio) for w in workers])
    assert all(ray.get([w.flush.remote() for w in workers]))
    steps = wait_for(lambda: len(ray.get(service.steps.remote("run1"))) == 4
                     and ray.get(service.steps.remote("run1")), PATIENCE_S, "four steps")
    assert [s["step"] for s in steps] == [0, 1, 2, 3]
    assert all(s["complete"] for s in steps)
    assert steps[3]["metrics"]["actor/is_ratio"] == pytest.approx(3.0)
    assert steps[0]["metrics"]["rollout/tokens"] == 20.0
    alerts = ray.get(service.alerts.remote("run1"))
    assert any(a["alert"] == "ISRatioDivergence" and a["state"] == "firing" and a["step"] == 2
               for a in alerts)
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    name = catalog.get("actor/is_ratio").prometheus_name
    assert any(line.startswith(name + "{") and line.endswith(" 3.0")
               for line in body.splitlines()), body[:2000]
    health = urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5)
    assert health.status == 200
    assert shutdown_runtime(ray_namespace)
    for w in workers:
        ray.kill(w)


def _run_job(ray: Any, namespace: str, tmp_path: Path, node_merge: bool) -> list[dict[str, Any]]:
    from rlmon.actors.reporter import Reporter

    opts = RuntimeOptions(state_dir=str(tmp_path / namespace), node_merge=node_merge,
                          deadline_s=30.0)
    service = ensure_runtime(namespace, opts)  # returns once the service answers
    if node_merge:  # ... and so does this node's merger: the test is of routing, and an actor's
        # cold start on a loaded two-core box (a Ray worker process) can alone take over 30 s
        ray.get(node_merger(namespace, 0, opts).flush.remote(), timeout=PATIENCE_S)
    reps = [Reporter("tier", "actor", rank={"dp": d, "cp": c}, world={"dp": 2, "cp": 2},
                     namespace=namespace, runtime=opts, step_seconds=False,
                     hardware_interval=None)  # values compared across two jobs
            for d in range(2) for c in range(2)]
    for step in range(3):
        for i, rep in enumerate(reps):
            rep.record("actor/loss", sum=0.125 * (i + step), count=float(i + 1))
            rep.record("actor/is_ratio_max", max=1.0 + 0.25 * i)
            rep.record("rollout/reward", sum=0.5 * step, count=2.0, replicated=["cp"])
            rep.end_step(step)
    assert all(rep.flush(PATIENCE_S) for rep in reps)
    steps = wait_for(lambda: len(ray.get(service.steps.remote("tier"))) == 3
                     and ray.get(service.steps.remote("tier")), PATIENCE_S, "three steps")
    for rep in reps:
        rep.close()
    assert shutdown_runtime(namespace)
    return steps


def test_collector_tier_on_ray_gives_the_same_steps(ray_cluster: Any, ray_namespace: str,
                                                    tmp_path: Path) -> None:
    direct = _run_job(ray_cluster, ray_namespace + "-direct", tmp_path, node_merge=False)
    tiered = _run_job(ray_cluster, ray_namespace + "-tier", tmp_path, node_merge=True)
    assert [s["metrics"] for s in tiered] == [s["metrics"] for s in direct]
    assert all(s["complete"] for s in tiered)
    assert tiered[2]["metrics"]["actor/loss"] == pytest.approx(0.125 * (2 + 3 + 4 + 5) / 10)
