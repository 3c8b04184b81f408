"""Liveness with real processes against a real Ray runtime (issue 23): a script whose training
thread hangs in a span pages RunStalled once, a SIGKILLed one pages RunDied once, a clean exit
pages nothing. Short configured thresholds keep it to seconds; the latencies are printed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from rlmon.actors.runtime import shutdown_runtime
from tests.support.polling import PATIENCE_S, wait_for, with_patience
from tests.support.ray_driver import driver_env, start_service

# wall-clock liveness under the Ray scheduler: make test-real and make test-load, not make test
pytestmark = [pytest.mark.ray, pytest.mark.slow]

CONFIG = """
notifiers: {console: {enabled: true}}
liveness:
  heartbeat_seconds: 0.5
  stall_floor_seconds: 6
  dead_after_seconds: 2.5
  evaluate_seconds: 0.2
  first_step_seconds: 60
"""

SCRIPT = with_patience("""
import os, sys, time
from rlmon import Reporter
mode, run, namespace = sys.argv[1:4]
rep = Reporter(run, "actor", rank={"dp": 0}, world={"dp": 1}, namespace=namespace,
               hardware_interval=None)
for step in range(10):
    with rep.span("train"):
        time.sleep(0.1)
    rep.record("actor/loss", sum=1.0, count=1.0)
    rep.end_step(step)
last = time.time()  # silence counts from here, not from the flush (slow on a busy machine)
assert rep.flush(PATIENCE_S), "steps not delivered"
print("last step at", last, flush=True)
if mode == "hang":
    with rep.span("rollout"), rep.span("generate"):
        time.sleep(3600)  # the process lives; its training thread is stuck here
elif mode == "kill":
    time.sleep(3600)  # SIGKILLed by the test
""")


def _start(tmp: Path, mode: str, run: str, namespace: str, address: str) -> subprocess.Popen[str]:
    """Start one script (written once before: rewriting it while an earlier one reads it ran an
    empty file under load)."""
    script = tmp / "train.py"
    return subprocess.Popen([sys.executable, str(script), mode, run, namespace],
                            env=driver_env(address),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _last_step_at(proc: subprocess.Popen[str]) -> float:
    assert proc.stdout is not None
    line = proc.stdout.readline()  # blocks until the script says it (or exits)
    assert line.startswith("last step at"), (line, proc.poll())
    return float(line.split()[-1])


def _alerts(ray: Any, service: Any, run: str) -> list[tuple[str, str]]:
    _, events = ray.get(service.recent_events.remote(0))
    return [(e.alert, e.state) for e in events if e.run == run]


def test_hung_killed_and_clean_scripts(ray_cluster: Any, ray_namespace: str,
                                       tmp_path: Path) -> None:
    ray = ray_cluster
    service = start_service(ray_namespace, tmp_path, CONFIG)
    address = ray.get_runtime_context().gcs_address
    (tmp_path / "train.py").write_text(SCRIPT)
    procs = {mode: _start(tmp_path, mode, f"{mode}-run", ray_namespace, address)
             for mode in ("hang", "kill", "clean")}
    try:
        # killed as soon as its last step is out: waiting for the other scripts first would leave
        # it silent-but-alive past the stall threshold on a busy machine, a stall before a death
        stopped = {"kill": _last_step_at(procs["kill"])}
        os.killpg(procs["kill"].pid, signal.SIGKILL)
        killed_at = time.time()
        stopped.update({mode: _last_step_at(procs[mode]) for mode in ("hang", "clean")})
        seen: dict[str, float] = {}

        def paged() -> bool:
            for mode, alert in (("hang", "RunStalled"), ("kill", "RunDied")):
                if mode not in seen and (alert, "firing") in _alerts(ray, service,
                                                                     f"{mode}-run"):
                    seen[mode] = time.time()
            return len(seen) == 2

        wait_for(paged, PATIENCE_S, "RunStalled for the hung script and RunDied for the killed one",
                 every=0.05)
        assert procs["clean"].wait(PATIENCE_S) == 0
        wait_for(lambda: time.time() - stopped["clean"] > 10, PATIENCE_S, "ten seconds past the clean "
                 "script's last step", every=0.2)
        assert _alerts(ray, service, "hang-run") == [("RunStalled", "firing")]
        assert _alerts(ray, service, "kill-run") == [("RunDied", "firing")]
        assert _alerts(ray, service, "clean-run") == []
        stall_latency = seen["hang"] - stopped["hang"]
        death_latency = seen["kill"] - killed_at
        print(f"\nliveness latencies: RunStalled {stall_latency:.1f}s after the last step "
              f"(threshold 6s), RunDied {death_latency:.1f}s after SIGKILL (dead after 2.5s)")
        assert 6.0 <= stall_latency < 20.0
        # silence is counted from the last heartbeat, up to one period (0.5 s) before the kill
        assert 2.0 <= death_latency < 15.0
        history = ray.get(service.alerts.remote("hang-run"))
        assert [(a["alert"], a["state"]) for a in history] == [("RunStalled", "firing")]
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        shutdown_runtime(ray_namespace)
