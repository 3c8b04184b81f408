"""Ray Jobs (``ray job submit`` through ``JobSubmissionClient``) end as their status says (issue
38): a job that succeeds pages nothing and its run reads finished; one that fails pages
``RunFailed`` naming the driver's exception; one stopped with ``ray job stop`` pages
``RunPreempted``; nothing else pages. The job API needs Ray's dashboard, which the session's Ray
has not: the cluster is started with one in a process of its own
(:mod:`tests.support.ray_jobs_child`). Latencies from each job's end and the words are printed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.network import free_port

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(900)]


def test_ray_jobs_succeeded_failed_and_stopped_page_what_they_should(tmp_path: Path) -> None:
    pytest.importorskip("ray.dashboard")
    pytest.importorskip("aiohttp")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("RLMON_") and k != "RAY_ADDRESS"}
    env.update(RLMON_LIVENESS__HEARTBEAT_SECONDS="0.5", RLMON_EXIT_TIMEOUT="30",
               RAY_DISABLE_USAGE_STATS="1", RAY_AUTH_MODE="disabled",
               RAY_ENABLE_UV_RUN_RUNTIME_ENV="0")
    done = subprocess.run([sys.executable, "-m", "tests.support.ray_jobs_child", str(tmp_path),
                           str(free_port()), str(free_port())], env=env, capture_output=True, text=True,
                          timeout=840)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, (done.returncode, done.stdout[-3000:],
                                            done.stderr[-5000:])
    said = json.loads(lines[-1].removeprefix("RESULT "))
    jobs = said["jobs"]
    report = ["", f"Ray with a dashboard started in {said['init_seconds']:.1f}s; Ray Jobs: "
              "latency from the job's end (as Ray recorded it), and the words"]
    for mode, job in jobs.items():
        firing = [a for a in job["alerts"] if a[2] == "firing"]
        words = (f"{firing[0][1]}: {firing[0][3]}" if firing
                 else f"no page; {job['detail']}")
        latency = job["seen"] - job["ended"] if job["seen"] else float("nan")
        report.append(f"  {mode} ({job['status']}, ended {job['ended'] - job['submitted']:.1f}s "
                      f"after submission, last step {job['last_step']}): {latency:.1f}s: {words}")
        if not job["seen"]:  # what Ray said of the job (its message ends with the job's logs)
            report.append("    Ray: " + job["message"][-3000:].replace("\n", "\n    "))
    print("\n".join(report))
    assert {mode: job["status"] for mode, job in jobs.items()} == {
        "succeeded": "SUCCEEDED", "failed": "FAILED", "stopped": "STOPPED"}, jobs
    fired = {mode: [(a[0], a[1]) for a in job["alerts"] if a[2] == "firing"]
             for mode, job in jobs.items()}
    assert fired == {"succeeded": [], "failed": [("actor", "RunFailed")],
                     "stopped": [("actor", "RunPreempted")]}, jobs
    assert {mode: job["state"] for mode, job in jobs.items()} == {
        "succeeded": "finished", "failed": "failed", "stopped": "preempted"}, jobs
    assert all(job["seen"] for job in jobs.values()), jobs
    succeeded = jobs["succeeded"]["detail"]
    assert succeeded.startswith("Finished at step 7, the last of 8 planned steps"), succeeded
    assert "SUCCEEDED" in succeeded, succeeded
    failed = next(a[3] for a in jobs["failed"]["alerts"] if a[2] == "firing")
    assert "RuntimeError: the learner diverged: loss is NaN at step 5" in failed, failed
    assert "FAILED" in failed and "last step 5" in failed, failed
    stopped = next(a[3] for a in jobs["stopped"]["alerts"] if a[2] == "firing")
    assert "STOPPED" in stopped, stopped
    # /metrics says how each ended (rlmon_run_end_info), beside the state
    for mode, cause in (("succeeded", "ray_job_succeeded"), ("failed", "RuntimeError"),
                        ("stopped", "ray job stop")):
        (line,) = jobs[mode]["metrics"]
        assert f'cause="{cause}"' in line and f'state="{jobs[mode]["state"]}"' in line, line
