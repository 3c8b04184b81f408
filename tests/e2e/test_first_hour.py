"""What a new user meets in the first hour: several Reporters in one process, a rerun under the
same run name, the defaults with nothing configured, and the process exiting.

The examples of ``examples/`` run here as scripts, each in a fresh process with a Ray of its own,
exactly as a user runs them: exit status 0, the alert on the console, ``/metrics`` answering, and
no Ray process left behind.
"""

from __future__ import annotations

import gc
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from rlmon.actors.reporter import Reporter
from rlmon.actors.runtime import RuntimeOptions, ensure_runtime, runtime_of, shutdown_runtime
from rlmon.service.aggregation.aggregator import AggregatorCore
from rlmon.service.aggregation.watermark import WatermarkStore
from rlmon.service.contract.step_message import StepMessage
from rlmon.service.service_core import ServiceCore
from tests.support.network import free_port
from tests.support.paths import REPO
from tests.support.polling import wait_for
from tests.support.scrape import scrape
from tests.support.sinks import AggregatorSink
from tests.support.subprocesses import run_in_own_session

ROOT = REPO


# -- several Reporters, one runtime (real Ray) -----------------------------------------------------

@pytest.mark.ray
def test_reporters_created_and_dropped_in_any_order_share_one_runtime(
        ray_cluster: Any, ray_namespace: str, tmp_path: Path) -> None:
    """The session's driver called ray.init itself (namespace rlmon-tests); rlmon's actors live
    in their own namespace. Before the fix, the second Reporter replaced the handle that kept
    the service alive and the service died ("all references to the actor were removed")."""
    ray = ray_cluster
    opts = RuntimeOptions(state_dir=str(tmp_path), port=0)
    service = ensure_runtime(ray_namespace, opts)  # a handle a user might keep, or drop
    del service
    kw: dict[str, Any] = {"rank": {"dp": 0}, "world": {"dp": 1}, "namespace": ray_namespace,
                          "runtime": opts}
    actor = Reporter("many", "actor", **kw)
    critic = Reporter("many", "critic", **kw)
    for step in range(3):
        actor.record("actor/loss", sum=1.0, count=2)
        actor.end_step(step)
        critic.record("critic/loss", sum=2.0, count=2)
        critic.end_step(step)
    assert actor.flush(60) and critic.flush(60), (actor.last_error, critic.last_error)
    actor.close()
    del actor
    gc.collect()
    reward = Reporter("many", "reward", **kw)  # made after another was dropped
    for step in range(3, 5):
        critic.record("critic/loss", sum=2.0, count=2)
        critic.end_step(step)
        reward.record("rollout/reward", sum=1.0, count=4)
        reward.end_step(step)
    assert critic.flush(60) and reward.flush(60), (critic.last_error, reward.last_error)
    runtime = runtime_of(ray_namespace)
    assert runtime is not None and runtime.owned
    roles = wait_for(
        lambda: (steps := ray.get(runtime.service.steps.remote("many")))
        and {(s["role"], s["step"]) for s in steps} >= {("actor", 2), ("critic", 4),
                                                         ("reward", 4)} and steps,
        30.0, "steps of all three roles")
    assert sorted({s["role"] for s in roles}) == ["actor", "critic", "reward"]
    assert ray.get(runtime.aggregators[0].ping.remote())
    critic.close()
    reward.close()
    assert shutdown_runtime(ray_namespace)


@pytest.mark.ray
def test_reporter_leaves_ray_to_its_sender_thread(ray_cluster: Any, ray_namespace: str,
                                                  tmp_path: Path) -> None:
    """Creating a Reporter and recording touch no Ray: the runtime is found (or started) by the
    sender thread once there is a step to send."""
    opts = RuntimeOptions(state_dir=str(tmp_path), port=0)
    rep = Reporter("lazy", "actor", rank={"dp": 0}, world={"dp": 1}, namespace=ray_namespace,
                   runtime=opts)
    rep.record("actor/loss", sum=1.0, count=1)
    rep.set_run_info(framework="custom")  # queued until the sender connects
    assert runtime_of(ray_namespace) is None
    rep.end_step(0)
    assert rep.flush(60), rep.last_error
    assert runtime_of(ray_namespace) is not None
    rep.close()
    assert shutdown_runtime(ray_namespace)


@pytest.mark.ray
def test_config_exporter_port_is_honoured_and_alerts_reach_the_console(
        ray_cluster: Any, ray_namespace: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """``exporter.port`` of a config given through RuntimeOptions(config=...) is where /metrics
    serves, and with no receiver configured the alert prints on this process's console."""
    import urllib.request

    port = free_port()  # free now, for the config to ask for
    config = tmp_path / "rlmon.yaml"
    config.write_text(f"exporter:\n  host: 127.0.0.1\n  port: {port}\n")
    opts = RuntimeOptions(config=str(config), state_dir=str(tmp_path / "state"))
    rep = Reporter("console", "actor", rank={"dp": 0}, world={"dp": 1}, namespace=ray_namespace,
                   runtime=opts)
    for step in range(4):
        rep.record("rollout/frac_reward_zero_std", sum=1.0, count=1)
        rep.end_step(step)
    assert rep.flush(60), rep.last_error
    runtime = runtime_of(ray_namespace)
    assert runtime is not None and runtime.port == port
    url = f"http://127.0.0.1:{port}/metrics"
    wait_for(lambda: 'rlmon_step{role="actor",run="console"} 3.0' in urllib.request.urlopen(
        url, timeout=10).read().decode(), 30.0, "step 3 on /metrics")
    rep.close()
    assert shutdown_runtime(ray_namespace)
    err = capsys.readouterr().err
    assert f"/metrics on http://127.0.0.1:{port}/metrics" in err
    assert "[CRITICAL] NoLearningSignal on console/actor step 2" in err


# -- a rerun under the same run name (in process) --------------------------------------------------

def _run(core: AggregatorCore, service: ServiceCore, steps: range, tied: float) -> Reporter:
    rep = Reporter("rerun", "actor", rank={"dp": 0}, world={"dp": 1}, sink=AggregatorSink(core))
    for step in steps:
        rep.record("rollout/frac_reward_zero_std", sum=tied, count=1)
        rep.end_step(step)
    assert rep.flush(10), rep.last_error
    service.publish(core.pending_records(), 0, core.stats())
    core.delivered(core.pending_records())
    return rep


def _scrape(service: ServiceCore) -> dict[str, float]:
    return {name: value for (name, lbl), value in scrape(service.metrics).items() if not lbl}


def test_a_rerun_under_the_same_name_is_recorded_as_a_new_attempt(tmp_path: Path) -> None:
    state = tmp_path / "state"
    store = WatermarkStore(state / "watermark-0.sqlite")
    core = AggregatorCore(store=store)
    service = ServiceCore(state_dir=state).start()
    first = _run(core, service, range(0, 5), tied=1.0)  # NoLearningSignal fires at step 2
    assert [(e.alert, e.state, e.step) for e in service.spine.commit.events] == [
        ("NoLearningSignal", "firing", 2)]
    first.close()
    # The next job: new aggregator and service on the same state directory, steps from 0 again.
    store.close()
    service.close()
    core = AggregatorCore(store=WatermarkStore(state / "watermark-0.sqlite"))
    service = ServiceCore(state_dir=state).start()
    second = _run(core, service, range(0, 4), tied=1.0)
    steps = service.history.steps("rerun")
    assert [(s["step"], s.get("attempt", 0)) for s in steps] == [
        (0, 0), (1, 0), (2, 0), (3, 0), (4, 0), (0, 1), (1, 1), (2, 1), (3, 1)]
    assert [(e.alert, e.state, e.step, e.attempt) for e in service.spine.commit.events] == [
        ("NoLearningSignal", "resolved", 0, 1), ("NoLearningSignal", "firing", 2, 1)]
    exported = _scrape(service)
    assert exported["rlmon_run_restarts_total"] == 1
    assert exported["rlmon_partials_late_total"] == 0
    # A resend from a reporter of this attempt, after its step finalized, is late: counted,
    # exported, not a third attempt.
    old = second._delivery._retained or second._delivery._pending
    assert not old
    late = core.ingest([StepMessage("rerun", "actor", 1, first.rank, first.world, 99,
                                    0.0, started=second._delivery.started)])
    assert (late.late, late.accepted) == (1, 0)
    service.publish([], 0, core.stats())
    assert _scrape(service)["rlmon_partials_late_total"] == 1
    assert core.stats().restarts == 1
    # A resumed run continues at a later step: the same attempt, no restart.
    _run(core, service, range(4, 6), tied=0.0)
    steps = service.history.steps("rerun")
    assert [(s["step"], s.get("attempt", 0)) for s in steps][-3:] == [(3, 1), (4, 1), (5, 1)]
    assert core.stats().restarts == 1
    service.close()


def test_docs_document_every_environment_variable() -> None:
    import re

    # a name read from the environment, not a Python name spelt the same (an enum member
    # `RLMON_HISTORY = ...`, read as `Format.RLMON_HISTORY`)
    # `RLMON_<SECTION>__` alone is a settings class's prefix, the family of names in the table
    env_name = re.compile(r"(?<![\w.])RLMON_[A-Z][A-Z_]*[A-Z](?!\w)(?!\s*=[^=])")
    used = set()
    for path in [*(ROOT / "rlmon").rglob("*.py"), *(ROOT / "examples").glob("*.py")]:
        used |= set(env_name.findall(path.read_text()))
    section = (ROOT / "docs" / "configuration.md").read_text().split("## Environment variables",
                                                                     1)[1].split("\n## ", 1)[0]
    table = "\n".join(line for line in section.splitlines() if line.startswith("|"))
    assert table, "no table under 'Environment variables'"
    assert used - {"RLMON_NOTIFIERS__SLACK"}, "found no variable at all"
    assert sorted(v for v in used if f"`{v}`" not in table and "__" not in v) == []


# -- the examples, as a user runs them -------------------------------------------------------------

def _ray_processes_under(root: Path) -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if str(root) in cmdline:
            found.append(cmdline[:200])
    return found


EXAMPLES = {
    # script: (console line of its alert, the /metrics line it prints)
    "quickstart.py": ("[CRITICAL] NoLearningSignal on quickstart/actor step 4",
                      'rlmon_step{role="actor",run="quickstart"} 11.0'),
    "two_roles.py": ("[CRITICAL] EntropyCollapse on two-roles/actor step 5",
                     'rlmon_step{role="actor",run="two-roles"} 10.0'),
    "own_ray.py": ("[WARNING] ClipRatioHigh on own-ray/actor step 4",
                   'rlmon_step{role="actor",run="own-ray"} 11.0'),
}


@pytest.mark.slow
@pytest.mark.examples
@pytest.mark.ray
@pytest.mark.parametrize("script", sorted(EXAMPLES))
def test_example_runs_as_a_user_runs_it(script: str, tmp_path: Path, ray_cluster: Any) -> None:
    """Each example against the session's Ray (``RAY_ADDRESS``, as a job on a cluster runs): one
    Ray for all of them instead of one each. A local Ray of rlmon's own, started and stopped
    whole by a script, is checked by ``test_no_second_ray_after_the_users_shutdown``."""
    env = {**os.environ, "RLMON_STATE_DIR": str(tmp_path / "state"),
           "RAY_ADDRESS": ray_cluster.get_runtime_context().gcs_address,
           "RAY_DISABLE_USAGE_STATS": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("RLMON_PORT", None)
    done = run_in_own_session([sys.executable, str(ROOT / "examples" / script)], timeout=240,
                              env=env, cwd=tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    alert, exported = EXAMPLES[script]
    assert alert in output, output[-4000:]
    assert exported in done.stdout, output[-4000:]  # /metrics answered with the last step
    assert "rlmon: service started in namespace 'rlmon': /metrics on http://127.0.0.1:" in output
    assert "Traceback" not in output, output[-4000:]
    # the script started rlmon's actors and owned them: its exit shut them down
    from ray.util import list_named_actors

    def rlmon_actors() -> list[str]:
        return [a["name"] for a in list_named_actors(all_namespaces=True)
                if a["namespace"] == "rlmon"]

    wait_for(lambda: not rlmon_actors(), 60, "the script's rlmon actors to be gone")
    # its Reporters closed before the exit shut the service down: the run is finished, and an
    # alert still firing then was closed with it, never left "firing now" in the store
    from rlmon.service.storage.history import HistoryStore

    state_dir = re.search(r"; state in (.+?); Ray at ", output)  # a job's actors: not ours
    assert state_dir is not None, output[-4000:]
    store = HistoryStore(Path(state_dir.group(1)) / "history.sqlite", read_only=True)
    try:
        assert store.firing_alerts() == []
        ended = [a for a in store.alerts(cost=True) if a["ended_with_run"]]
        finished = {row["role"] for row in store.liveness() if row["state"] == "finished"}
    finally:
        store.close()
    assert "actor" in finished
    for a in ended:
        assert f"[{a['severity'].upper()}, still firing when the run ended] {a['alert']}" in output


AFTER_SHUTDOWN = """
import ray
from rlmon.actors.reporter import Reporter

rep = Reporter("after-shutdown", "actor", rank={"dp": 0}, world={"dp": 1})
rep.record("actor/loss", sum=1.0, count=1)
rep.end_step(0)
assert rep.flush(120), rep.last_error
ray.shutdown()  # the user's own shutdown, before the Reporter is done
for step in (1, 2):
    rep.record("actor/loss", sum=1.0, count=1)
    rep.end_step(step)
print("steps after shutdown recorded; exiting without close()")
"""


@pytest.mark.slow
@pytest.mark.examples
def test_no_second_ray_after_the_users_shutdown(tmp_path: Path) -> None:
    """A Reporter that outlives ``ray.shutdown()`` and is never closed: the exit flush must not
    start a second local Ray (which outlived the script, and crashed it beside vLLM); what it
    could not send is counted and said once."""
    ray_tmp = Path(tempfile.mkdtemp(prefix="rlx-"))
    env = {**os.environ, "RLMON_STATE_DIR": str(tmp_path / "state"), "RAY_TMPDIR": str(ray_tmp),
           "RAY_DISABLE_USAGE_STATS": "1", "RLMON_EXIT_TIMEOUT": "20"}
    done = run_in_own_session([sys.executable, "-c", AFTER_SHUTDOWN], timeout=240, env=env,
                              cwd=tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert output.count("Started a local Ray instance") == 1, output[-4000:]
    assert "does not restart it" in output and "not sent (counted as dropped)" in output, \
        output[-4000:]
    assert _ray_processes_under(ray_tmp) == []
    shutil.rmtree(ray_tmp, ignore_errors=True)
