"""Every way a Ray-actor job ends, with real drivers and rank actors against the session's Ray
(issue 38): the driver returns, kills its actors with ``ray.kill`` (and exits, or stays), the ranks
save for longer than the stall floor after their last step, a rank raises (with rlmon's method
wrapper, and without: Ray's failed-task events, also while a notebook-like driver lingers with
its actors alive), a rank's worker is killed with SIGKILL, and a node is removed. Each pages
exactly what it should and nothing else; a clean end reads finished with how it ended. Short
configured thresholds keep it to seconds; latencies and words are printed. The actors heartbeat
at the service's configured period (their workers have Ray's environment, not the driver's):
at the 5 s default instead, a lingering driver's idle ranks read as still in ``train``."""

from __future__ import annotations

import contextlib
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
from tests.support.polling import PATIENCE_S, wait_for
from tests.support.ray_driver import RANKS_DRIVER, driver_env, start_service

pytestmark = [pytest.mark.ray, pytest.mark.slow]

CONFIG = """
notifiers: {console: {enabled: true}}
exporter: {port: 0}
liveness:
  heartbeat_seconds: 0.5
  stall_floor_seconds: 4
  dead_after_seconds: 6
  evaluate_seconds: 0.2
  save_span_seconds: 60
  final_seconds: 60
"""

# what each ending pages (role, alert) and what state its run ends in
EXPECTED: dict[str, tuple[tuple[str, str] | None, str]] = {
    "returns": (None, "finished"),
    "kill": (None, "finished"),
    "kill_stays": (None, "finished"),
    "final_save": (None, "finished"),
    "released": (None, "finished"),
    "raises_watched": (("actor", "RunFailed"), "failed"),
    "raises": (("actor", "RunFailed"), "failed"),
    "raises_lingers": (("actor", "RunFailed"), "failed"),
    "sigkill": (("actor", "RunFailed"), "failed"),
}


class Driver:
    """One driver process and what it said (ready with rank 1's pid, killed, ending)."""

    def __init__(self, tmp: Path, mode: str, namespace: str, address: str) -> None:
        self.mode, self.go = mode, tmp / f"go-{mode}"
        self.proc = subprocess.Popen(
            [sys.executable, str(tmp / "driver.py"), mode, f"{mode}-run", namespace,
             str(self.go)], env=driver_env(address), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, start_new_session=True)
        self.said: dict[str, list[str]] = {}
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            word, *rest = line.split() or [""]
            if word not in ("ready", "killed", "ending"):
                continue  # anything else a driver prints (Ray's own lines)
            self.said[word] = rest
            self.said.setdefault("at " + word, [str(time.time())])

    def at(self, word: str) -> float | None:
        return float(self.said[word][0]) if word in self.said else None

    def stop(self) -> str:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.reader.join(30)
        _, err = self.proc.communicate()
        return err[-3000:]


def _events(ray: Any, service: Any) -> dict[str, list[Any]]:
    _, events = ray.get(service.recent_events.remote(0))
    out: dict[str, list[Any]] = {}
    for e in events:
        out.setdefault(e.run, []).append(e)
    return out


def _states(ray: Any, service: Any) -> dict[str, dict[str, Any]]:
    return {row["run"]: row for row in ray.get(service.run_states.remote())}


def _watch(ray: Any, service: Any, drivers: dict[str, Driver], expected: dict[str, Any],
           actions: Any) -> tuple[dict[str, float], dict[str, dict[str, Any]]]:
    """Until every run reached its end (the expected alert, and the state): when each did."""
    seen: dict[str, float] = {}

    def done() -> bool:
        actions()
        for driver in drivers.values():
            assert driver.proc.poll() is None or "ready" in driver.said or \
                driver.proc.returncode == 0, (driver.mode, driver.stop())
        events, states = _events(ray, service), _states(ray, service)
        for mode, (alert, state) in expected.items():
            run = f"{mode}-run"
            fired = [(e.role, e.alert) for e in events.get(run, []) if e.state == "firing"]
            ended = states.get(run, {}).get("state") == state
            if mode not in seen and ended and (alert is None or alert in fired):
                seen[mode] = time.time()
        return len(seen) == len(expected)

    try:
        wait_for(done, PATIENCE_S, "every run's end", every=0.1)
    except pytest.fail.Exception:
        said = {mode: (d.said, d.proc.poll()) for mode, d in drivers.items()}
        pytest.fail(f"not every run ended as expected: ended {sorted(seen)}; drivers said "
                    f"{said}; states {_states(ray, service)}; events "
                    f"{ {r: [(e.alert, e.state) for e in es] for r, es in _events(ray, service).items()} }")
    return seen, _states(ray, service)


def _check_pages(ray: Any, service: Any, expected: dict[str, Any]) -> dict[str, Any]:
    """A moment past the ends: exactly the expected pages, nothing else."""
    settle = time.time()
    wait_for(lambda: time.time() - settle > 5.0, PATIENCE_S, "five seconds more", every=0.2)
    events = _events(ray, service)
    firing = {}
    for mode, (alert, _) in expected.items():
        got = [(e.role, e.alert) for e in events.get(f"{mode}-run", []) if e.state == "firing"]
        assert got == ([alert] if alert else []), (mode, got)
        firing[mode] = next((e for e in events.get(f"{mode}-run", []) if e.state == "firing"),
                            None)
    return firing


def _report(seen: dict[str, float], since: dict[str, float], firing: dict[str, Any],
            states: dict[str, dict[str, Any]]) -> None:
    lines = ["", "Ray run ends: latency from the end, and the words"]
    for mode, at in seen.items():
        event = firing.get(mode)
        words = (f"{event.alert}: {event.detail}" if event is not None
                 else f"no page; {states[f'{mode}-run']['detail']}")
        lines.append(f"  {mode}: {at - since[mode]:.1f}s: {words}")
    print("\n".join(lines))


def test_every_ray_actor_ending_pages_what_it_should(ray_cluster: Any, ray_namespace: str,
                                                    tmp_path: Path) -> None:
    ray = ray_cluster
    service = start_service(ray_namespace, tmp_path, CONFIG)
    address = ray.get_runtime_context().gcs_address
    (tmp_path / "driver.py").write_text(RANKS_DRIVER)
    drivers = {mode: Driver(tmp_path, mode, ray_namespace, address) for mode in EXPECTED}
    killed: dict[str, float] = {}
    stays_checked: list[bool] = []

    def actions() -> None:
        sigkill = drivers["sigkill"]
        if "ready" in sigkill.said and "sigkill" not in killed:
            os.kill(int(sigkill.said["ready"][1]), signal.SIGKILL)  # rank 1's worker process
            killed["sigkill"] = time.time()
            sigkill.go.touch()
        released = drivers["released"]
        if "ready" in released.said and not released.go.exists() and _states(ray, service).get(
                "released-run", {}).get("state") == "finished":
            released.go.touch()  # finished while its driver lives on
        lingers = drivers["raises_lingers"]
        if not lingers.go.exists() and _states(ray, service).get(
                "raises_lingers-run", {}).get("state") == "failed":
            lingers.go.touch()  # failed while its driver and actors lived on: it may go
        stays = drivers["kill_stays"]
        # the driver is alive, its actors killed after their last step: finished already
        if "killed" in stays.said and not stays_checked and _states(ray, service).get(
                "kill_stays-run", {}).get("state") == "finished":
            stays_checked.append(True)
            stays.go.touch()

    try:
        seen, states = _watch(ray, service, drivers, EXPECTED, actions)
        for mode in ("returns", "kill", "final_save", "raises", "raises_watched", "released"):
            assert drivers[mode].proc.wait(PATIENCE_S) == (1 if "raises" in mode else 0), mode
        assert drivers["kill_stays"].proc.wait(PATIENCE_S) == 0 and stays_checked
        assert drivers["raises_lingers"].proc.wait(PATIENCE_S) == 0
        assert drivers["sigkill"].proc.wait(PATIENCE_S) == 1
        firing = _check_pages(ray, service, EXPECTED)
        for mode in ("returns", "final_save"):
            assert "driver ended normally" in states[f"{mode}-run"]["detail"], states
        for mode in ("kill", "kill_stays"):
            assert "ray.kill" in states[f"{mode}-run"]["detail"], states
        # __ray_shutdown__ closed the Reporters (or, had it come late, Ray's OUT_OF_SCOPE)
        released = states["released-run"]["detail"]
        assert "its Reporters closed cleanly" in released or "out of scope" in released
        for mode in EXPECTED:
            if EXPECTED[mode][1] == "finished":
                assert states[f"{mode}-run"]["detail"].startswith(
                    "Finished at step 7, the last of 8 planned steps")
        watched = firing["raises_watched"].detail
        assert watched.startswith("dp=1: ValueError: reward model returned NaN for every sample")
        # the wrapper's note, said in a heartbeat at once, or in the closing heartbeat of the
        # actor's exit flush (Ray's SIGTERM at the driver's exit): the stage where it was raised
        assert "in train/reward, last step 5" in watched
        tasks = firing["raises"].detail
        assert "dp=1: ValueError: reward model returned NaN for every sample" in tasks
        assert "Rank.step of its actor raised ValueError (a failed task)" in tasks
        # no wrapper, the actors alive: Ray's task events said it at the stall threshold
        lingers = firing["raises_lingers"].detail
        assert lingers.startswith("dp=1: ValueError: reward model returned NaN"), lingers
        assert "Rank.step of its actor raised ValueError (a failed task) and no step " \
               "followed" in lingers, lingers
        worker = firing["sigkill"].detail
        assert worker.startswith("dp=1: WorkerDied") and "worker process of its actor died" \
            in worker
        # the latency from each end: the driver's last word, its kill, the SIGKILL
        since = {mode: drivers[mode].at("at ending") or 0.0 for mode in EXPECTED}
        for mode in ("raises", "raises_watched", "raises_lingers", "released"):  # at ready
            since[mode] = drivers[mode].at("at ready") or 0.0
        since["kill_stays"] = drivers["kill_stays"].at("at killed") or 0.0
        since["sigkill"] = killed["sigkill"]
        _report(seen, since, firing, states)
    finally:
        errors = {mode: driver.stop() for mode, driver in drivers.items()}
        shutdown_runtime(ray_namespace)
    assert errors  # each driver's stderr was read to its end (no pipe left full)


def test_a_removed_node_fails_the_run_naming_the_node(ray_cluster: Any, ray_namespace: str,
                                                     tmp_path: Path) -> None:
    """A second node joins the session's cluster and holds the ranks; it is then removed as
    ``ray.cluster_utils.Cluster.remove_node`` does (its raylet and workers killed, no grace): the
    run fails, naming the node. The node is added the way ``Cluster.add_node`` adds a worker
    node, to the session's Ray (``ray start`` and a ``Cluster`` head would leave their address
    in Ray's temp folder, where every ``ray.init()`` on the machine would find it)."""
    from ray._private.node import Node
    from ray._private.parameter import RayParams

    ray = ray_cluster
    # Ray declares a node dead after its health checks fail (about 15 s): the dead limit is
    # set above that, as the default 30 s is, so that Ray's word comes first
    service = start_service(ray_namespace, tmp_path,
                            CONFIG.replace("dead_after_seconds: 6", "dead_after_seconds: 45"))
    address = ray.get_runtime_context().gcs_address
    (tmp_path / "driver.py").write_text(RANKS_DRIVER)
    params = RayParams(gcs_address=address, num_cpus=1, num_gpus=0,
                       resources={"lost_node": 1.0}, object_store_memory=80 * 1024 * 1024,
                       min_worker_port=0, max_worker_port=0, include_log_monitor=False,
                       node_manager_port=0)
    params.dashboard_agent_listen_port = None
    node = Node(params, head=False, shutdown_at_exit=False, spawn_reaper=False)
    driver = None
    try:
        wait_for(lambda: any(n["Alive"] and n["Resources"].get("lost_node") for n in ray.nodes()),
                 PATIENCE_S, "the second node")
        driver = Driver(tmp_path, "node", ray_namespace, address)
        lost: dict[str, float] = {}

        def actions() -> None:
            if "ready" in driver.said and not lost:
                # the machine is gone: its raylet, and at once the workers it started (left
                # alone they would serve the driver's direct calls until they noticed)
                node.kill_all_processes(check_alive=False, allow_graceful=False, wait=True)
                for pid in driver.said["ready"][1:3]:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)
                lost["node"] = time.time()
                driver.go.touch()

        expected = {"node": (("actor", "RunFailed"), "failed")}
        seen, states = _watch(ray, service, {"node": driver}, expected, actions)
        firing = _check_pages(ray, service, expected)
        text = firing["node"].detail
        assert "NodeDied" in text or "WorkerDied" in text, text
        assert "node" in text
        _report(seen, {"node": lost["node"]}, firing, states)
    finally:
        if driver is not None:
            driver.stop()
        node.kill_all_processes(check_alive=False, allow_graceful=False, wait=True)
        shutdown_runtime(ray_namespace)
