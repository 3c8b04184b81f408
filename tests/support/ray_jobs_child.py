"""A Ray cluster with a dashboard, and three Ray Jobs submitted to it with ``JobSubmissionClient``
(``ray job submit``), each the driver of :mod:`tests.support.ray_driver`: one succeeds, one
fails, one is stopped with ``ray job stop``. Run as a process of its own by
tests/ray/test_ray_jobs.py: the session's Ray has no dashboard (the job API needs one), and a
process joins one Ray cluster only. Started as a head node with a temp folder of its own, where
its address is written for the job supervisor, not with ``ray start``, which would write it in
Ray's shared temp folder for every ``ray.init()`` on the machine. Prints one JSON line: per job,
its end (status, end time) and what rlmon said (state, how it ended, the alerts that fired, when
it first saw the end)."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from tests.support.ray_driver import RANKS_DRIVER

CONFIG = """
notifiers: {console: {enabled: true}}
exporter: {port: 0}
liveness:
  heartbeat_seconds: 0.5
  stall_floor_seconds: 60  # the stopped job waits for its stop: not a stall under test
  dead_after_seconds: 20
  evaluate_seconds: 0.2
"""

# per job: the alert it pages (role, alert) and the state its run ends in
EXPECTED: dict[str, tuple[tuple[str, str] | None, str]] = {
    "succeeded": (None, "finished"),
    "failed": (("actor", "RunFailed"), "failed"),
    "stopped": (("actor", "RunPreempted"), "preempted"),
}
PATIENCE = 240.0  # for the dashboard's agent to take jobs
# A job's run must be judged within JUDGE_WITHIN seconds of the job's end as Ray recorded it;
# the jobs themselves may take long to end on a loaded machine (each starts a driver and two
# worker processes), and that is not what is measured.
JUDGE_WITHIN = 60.0
JOBS_END_WITHIN = 600.0


def _submit(client: Any, entrypoint: str) -> str:
    """Submit a job, once the dashboard's agent takes jobs (it starts after the dashboard:
    until then the job API answers "No available agent to submit job")."""
    deadline = time.monotonic() + PATIENCE
    while True:
        try:
            return str(client.submit_job(entrypoint=entrypoint))
        except RuntimeError as exc:
            if "No available agent" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def main(tmp: Path, dashboard_port: int, agent_port: int) -> None:
    import ray
    from ray._private.node import Node
    from ray._private.parameter import RayParams
    from ray._private.utils import write_ray_address
    from ray.job_submission import JobStatus, JobSubmissionClient

    from rlmon.actors.runtime import RuntimeOptions, ensure_runtime, shutdown_runtime

    namespace = "ray-jobs"
    started = time.monotonic()
    # a head node as ray.init starts one, but with the dashboard agent on a free port (its
    # default, 52365, is taken by any other Ray with a dashboard on the machine: its job API
    # then answers "No available agent" for ever)
    # Ray's temp folder of its own, holding its address: the job supervisor hands each job the
    # address it reads there, and without one it takes any Ray running on the machine (the test
    # session's, another session's), whose jobs then ran elsewhere or failed to connect
    temp_dir = tempfile.mkdtemp(prefix="rlmon-jobs-")
    node = Node(RayParams(num_cpus=2, include_dashboard=True, dashboard_host="127.0.0.1",
                          dashboard_port=dashboard_port, dashboard_agent_listen_port=agent_port,
                          temp_dir=temp_dir),
                head=True, shutdown_at_exit=True, spawn_reaper=True)
    write_ray_address(node.address, temp_dir)
    context = ray.init(address=node.address, namespace=namespace, log_to_driver=False,
                       configure_logging=False)
    init_seconds = time.monotonic() - started  # Ray with its dashboard, up
    (tmp / "rlmon.yaml").write_text(CONFIG)
    (tmp / "job.py").write_text(RANKS_DRIVER)
    service = ensure_runtime(namespace, RuntimeOptions(config=str(tmp / "rlmon.yaml"),
                                                       state_dir=str(tmp / "state")))
    client = JobSubmissionClient(f"http://{context.dashboard_url}")
    ids = {mode: _submit(client, f"{sys.executable} {tmp / 'job.py'} {mode} {mode}-run "
                                 f"{namespace} {tmp / ('ready-' + mode)}") for mode in EXPECTED}
    submitted = time.time()
    seen: dict[str, float] = {}
    ended: dict[str, float] = {}  # per job, its end as Ray recorded it
    stop_asked = 0.0
    deadline = time.monotonic() + JOBS_END_WITHIN
    states: dict[str, dict] = {}
    events: dict[str, list] = {}
    while len(seen) < len(EXPECTED):
        if not stop_asked and (tmp / "ready-stopped").exists():
            stop_asked = time.time()
            client.stop_job(ids["stopped"])
        for mode, job_id in ids.items():
            if mode not in ended:
                info = client.get_job_info(job_id)
                if info.end_time:
                    ended[mode] = info.end_time / 1000.0
        waiting = [mode for mode in EXPECTED if mode not in seen]
        if time.monotonic() > deadline and any(mode not in ended for mode in waiting):
            break  # a job that never ended: its status is printed
        if waiting and all(mode in ended and time.time() - ended[mode] > JUDGE_WITHIN
                           for mode in waiting):
            break  # every job left has ended, and rlmon has not said so within JUDGE_WITHIN
        states = {row["run"]: row for row in ray.get(service.run_states.remote())}
        events = {}
        for e in ray.get(service.recent_events.remote(0))[1]:
            events.setdefault(e.run, []).append(e)
        for mode, (alert, state) in EXPECTED.items():
            fired = [(e.role, e.alert) for e in events.get(f"{mode}-run", [])
                     if e.state == "firing"]
            if (mode not in seen and states.get(f"{mode}-run", {}).get("state") == state
                    and (alert is None or alert in fired)):
                seen[mode] = time.time()
        time.sleep(0.1)
    settle = time.monotonic() + 5.0  # a moment past the ends: nothing else pages
    while time.monotonic() < settle:
        time.sleep(0.2)
    states = {row["run"]: row for row in ray.get(service.run_states.remote())}
    events = {}
    for e in ray.get(service.recent_events.remote(0))[1]:
        events.setdefault(e.run, []).append(e)
    port = ray.get(service.layout.remote())["port"]  # /metrics: how each run ended
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as page:
        ends = [line for line in page.read().decode().splitlines()
                if line.startswith("rlmon_run_end_info{")]
    out = {}
    for mode, job_id in ids.items():
        info = client.get_job_info(job_id)
        row = states.get(f"{mode}-run", {})
        out[mode] = {
            "status": str(info.status.value if isinstance(info.status, JobStatus)
                          else info.status),
            "message": info.message or "", "ended": (info.end_time or 0) / 1000.0,
            "seen": seen.get(mode), "state": row.get("state"), "detail": row.get("detail", ""),
            "submitted": submitted, "last_step": row.get("last_step"),
            "alerts": [[e.role, e.alert, e.state, e.detail] for e in events.get(f"{mode}-run", [])],
            "metrics": [line for line in ends if f'run="{mode}-run"' in line],
        }
    shutdown_runtime(namespace)
    ray.shutdown()
    node.kill_all_processes(check_alive=False, allow_graceful=True, wait=True)
    shutil.rmtree(temp_dir, ignore_errors=True)
    print("RESULT " + json.dumps({"init_seconds": init_seconds, "jobs": out}), flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
