"""Every way a run ends badly, with real processes against a real Ray runtime (issue 29): an
uncaught exception, the same inside ``with Reporter``, a rank actor raising under a Ray driver,
a SIGTERM, a hang after step 0, a hang in the first weight sync before any step, a SIGSTOP
followed by a clean finish, and a slow first step;
each pages what it should and nothing else. Short configured thresholds keep it to seconds; the
latencies are printed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
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
  sync_span_seconds: 8
"""

SCRIPT = with_patience("""
import os, sys, time
from rlmon import Reporter
mode, run, namespace, go = sys.argv[1:5]

def steps(rep, first, n, span="train"):
    for step in range(first, first + n):
        with rep.span(span):
            time.sleep(0.05)
        rep.record("actor/loss", sum=1.0, count=1.0)
        rep.end_step(step)
    return time.time()

def ready(rep, last=None):
    # the last step's end too: silence counts from there, not from the flush (slow under load)
    assert rep.flush(PATIENCE_S), "steps not delivered"
    now = time.time()
    print("ready", now, last or now, flush=True)

if mode == "with_raise":
    with Reporter(run, "actor", rank={"dp": 0}, world={"dp": 1}, namespace=namespace,
                  hardware_interval=None) as rep:
        steps(rep, 0, 10)
        ready(rep)
        with rep.span("weight_sync"):
            time.sleep(1.5)  # a few heartbeats in the stage, then the collective fails
            raise RuntimeError("NCCL error: unhandled system error, NCCL version 2.21.5")
    sys.exit(0)

rep = Reporter(run, "actor", rank={"dp": 0}, world={"dp": 1}, namespace=namespace,
               hardware_interval=None)
if mode == "slow_first":
    with rep.span("load_model"):
        time.sleep(8.0)  # longer than the stall floor: a slow start never pages
    steps(rep, 0, 10)
    rep.close()
elif mode == "sync_first":
    with rep.span("weight_sync"):  # the first weight broadcast, before any step, never returns
        print("ready", time.time(), time.time(), flush=True)
        time.sleep(3600)
elif mode == "hang0":
    ready(rep, steps(rep, 0, 1))
    with rep.span("weight_sync"):
        time.sleep(3600)  # the first weight sync never returns; the process lives
elif mode == "sigterm":
    steps(rep, 0, 10)
    ready(rep)
    step = 10
    while True:  # a job at work: the scheduler's SIGTERM ends it (silent, it would be a stall)
        steps(rep, step, 1)
        step += 1
elif mode == "sigstop":
    steps(rep, 0, 10)
    ready(rep)
    step = 10
    while not os.path.exists(go):  # the test stops and continues the process meanwhile
        steps(rep, step, 1)
        step += 1
    steps(rep, step, 5)
    rep.close()
else:  # raise
    steps(rep, 0, 20)
    ready(rep)
    with rep.span("update_actor"):  # raised at once: no heartbeat saw the stage, the end says it
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
""")

DRIVER = with_patience("""
import sys, time
import ray
from rlmon import Reporter
run, namespace = sys.argv[1:3]
ray.init(namespace=namespace)

@ray.remote
class Rank:
    def __init__(self):
        self.rep = Reporter(run, "actor", rank={"dp": 0}, world={"dp": 1}, namespace=namespace,
                            hardware_interval=None)
        self.step = 0

    def train(self, n, fail=False):
        for _ in range(n):
            with self.rep.span("train"):
                time.sleep(0.05)
            self.rep.record("actor/loss", sum=1.0, count=1.0)
            self.rep.end_step(self.step)
            self.step += 1
        assert self.rep.flush(PATIENCE_S)
        if fail:
            raise ValueError("reward function raised on a bad batch")

rep = Reporter(run, "driver", rank={"dp": 0}, world={"dp": 1}, namespace=namespace,
               hardware_interval=None)
rank = Rank.remote()
for step in range(5):
    ray.get(rank.train.remote(2))
    rep.record("driver/loop", sum=1.0, count=1.0)
    rep.end_step(step)
assert rep.flush(PATIENCE_S)
print("ready", time.time(), time.time(), flush=True)
ray.get(rank.train.remote(1, fail=True))  # raises RayTaskError(ValueError): uncaught
""")

EXPECTED = {
    "raise": ("actor", "RunFailed"),
    "with_raise": ("actor", "RunFailed"),
    "actor_raise": ("driver", "RunFailed"),
    "sigterm": ("actor", "RunPreempted"),
    "hang0": ("actor", "RunStalled"),
    "sync_first": ("actor", "RunStalled"),
    "sigstop": ("actor", "RunFrozen"),
    "slow_first": None,
}


def _start(tmp: Path, mode: str, namespace: str, address: str) -> subprocess.Popen[str]:
    """Start one script (written before any starts: rewriting it while an earlier one reads it
    ran an empty file under load)."""
    if mode == "actor_raise":
        script = tmp / "driver.py"
        args = [f"{mode}-run", namespace]
    else:
        script = tmp / "train.py"
        args = [mode, f"{mode}-run", namespace, str(tmp / "go")]
    return subprocess.Popen([sys.executable, str(script), *args], env=driver_env(address),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _ready_at(proc: subprocess.Popen[str]) -> tuple[float, float] | str:
    """When the script was ready, and when its last step ended; what it said if it never was."""
    assert proc.stdout is not None
    line = proc.stdout.readline()  # blocks until the script says it (or exits)
    if not line.startswith("ready"):
        return f"{line!r}, exit {proc.wait()}, stderr {proc.stderr and proc.stderr.read()}"
    now, last = line.split()[1:3]
    return float(now), float(last)


def _alerts(ray: Any, service: Any) -> dict[str, list[tuple[str, str, str]]]:
    _, events = ray.get(service.recent_events.remote(0))
    out: dict[str, list[tuple[str, str, str]]] = {f"{mode}-run": [] for mode in EXPECTED}
    for e in events:
        out.setdefault(e.run, []).append((e.role, e.alert, e.state))
    return out


def test_every_bad_ending_pages_what_it_should(ray_cluster: Any, ray_namespace: str,
                                              tmp_path: Path) -> None:
    ray = ray_cluster
    service = start_service(ray_namespace, tmp_path, CONFIG)
    address = ray.get_runtime_context().gcs_address
    (tmp_path / "train.py").write_text(SCRIPT)
    (tmp_path / "driver.py").write_text(DRIVER)
    procs = {mode: _start(tmp_path, mode, ray_namespace, address) for mode in EXPECTED}
    # each script's "ready" is read as it comes, and the alerts watched meanwhile: a page is
    # seen when it happens, not once the slowest script (a Ray driver's start) is ready too
    ready: dict[str, tuple[float, float] | str] = {}
    readers = [threading.Thread(target=lambda m=mode, p=proc: ready.__setitem__(m, _ready_at(p)),
                                daemon=True) for mode, proc in procs.items() if mode != "slow_first"]
    for reader in readers:
        reader.start()
    try:
        signalled: dict[str, float] = {}
        seen: dict[str, float] = {}

        def paged() -> bool:
            for mode, said in ready.items():
                assert not isinstance(said, str), (mode, said)
            for mode, sig in (("sigterm", signal.SIGTERM), ("sigstop", signal.SIGSTOP)):
                if mode in ready and mode not in signalled:  # at work: the signal comes now
                    os.killpg(procs[mode].pid, sig)
                    signalled[mode] = time.time()
            alerts = _alerts(ray, service)
            for mode, want in EXPECTED.items():
                if want is not None and mode not in seen and (
                        *want, "firing") in alerts[f"{mode}-run"]:
                    seen[mode] = time.time()
                    if mode == "sigstop":  # went on as soon as paged: its stop is not as long
                        os.killpg(procs["sigstop"].pid, signal.SIGCONT)  # as the slowest page
            return len(seen) == len([w for w in EXPECTED.values() if w is not None])

        try:
            wait_for(paged, PATIENCE_S, "each bad ending's alert", every=0.05)
        finally:
            os.killpg(procs["sigstop"].pid, signal.SIGCONT)
        wait_for(lambda: ("actor", "RunFrozen", "resolved") in _alerts(ray, service)[
            "sigstop-run"], PATIENCE_S, "RunFrozen resolved once the process goes on")
        (tmp_path / "go").touch()
        assert procs["sigstop"].wait(PATIENCE_S) == 0
        assert procs["slow_first"].wait(PATIENCE_S) == 0
        assert procs["raise"].wait(PATIENCE_S) == 1 and procs["with_raise"].wait(PATIENCE_S) == 1
        assert procs["actor_raise"].wait(PATIENCE_S) == 1
        assert procs["sigterm"].wait(PATIENCE_S) == -signal.SIGTERM
        # a moment past the ends: nothing else pages (no RunDied beside a failure, no RunStalled
        # for the frozen script that went on, nothing for the slow start or the clean finish)
        settle = time.time()
        wait_for(lambda: time.time() - settle > 4.0, PATIENCE_S, "four seconds more", every=0.2)
        alerts = _alerts(ray, service)
        got = {mode: alerts[f"{mode}-run"] for mode in EXPECTED}
        for mode, want in EXPECTED.items():
            fired = [(role, alert) for role, alert, state in got[mode] if state == "firing"]
            assert fired == ([want] if want else []), (mode, got[mode])
        text = {e.run: e for e in ray.get(service.recent_events.remote(0))[1]
                if e.state == "firing"}
        assert "RuntimeError: CUDA out of memory" in text["raise-run"].detail
        assert "; in update_actor, last step 19" in text["raise-run"].detail
        assert "NCCL error" in text["with_raise-run"].detail
        assert "; in weight_sync" in text["with_raise-run"].detail
        assert "ValueError" in text["actor_raise-run"].detail
        assert "reward function raised" in text["actor_raise-run"].detail
        assert "killed by SIGTERM" in text["sigterm-run"].detail
        assert "weight_sync" in text["hang0-run"].detail
        assert "weight_sync" in text["sync_first-run"].detail
        frozen = text["sigstop-run"].detail
        assert "Processes still exist" in frozen and "gone" not in frozen
        # from the raise (at once after "ready", or 1.5 s into its span), the step 0 before the
        # hang, the signal
        at = {mode: said for mode, said in ready.items() if isinstance(said, tuple)}
        latency = {"with_raise": seen["with_raise"] - at["with_raise"][0] - 1.5}
        latency.update({mode: seen[mode] - at[mode][0]
                        for mode in ("raise", "actor_raise", "sync_first")})
        latency["hang0"] = seen["hang0"] - at["hang0"][1]
        latency.update({mode: seen[mode] - signalled[mode] for mode in ("sigterm", "sigstop")})
        print("\nliveness latencies (s): " + ", ".join(
            f"{mode} {EXPECTED[mode][1]} {value:.1f}"  # type: ignore[index]
            for mode, value in latency.items()))
        assert latency["hang0"] >= 6.0  # not before the stall floor after a 0.05 s step 0
        assert latency["sync_first"] >= 8.0  # not before the sync allowance
        assert latency["sigstop"] >= 2.0  # silent for the dead limit first
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGCONT)
                os.killpg(proc.pid, signal.SIGKILL)
        for reader in readers:
            reader.join(30)
        for proc in procs.values():
            proc.communicate()
        shutdown_runtime(ray_namespace)
