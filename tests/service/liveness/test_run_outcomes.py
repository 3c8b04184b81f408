"""How a run ends and whether a silent one still exists: failed, preempted, finished, frozen,
dead; through the tracker, and through the service into RunFailed, RunPreempted, RunFrozen."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from rlmon.cli import main
from rlmon.service.contract.heartbeat import (
    Heartbeat,
    OpenSpan,
    Outcome,
    OutcomeKind,
    ProcessId,
    RankBeat,
)
from rlmon.service.liveness.process_probe import ProcessFate, SameNodeProbe
from rlmon.service.liveness.run_state import LivenessTracker, RunState, describe
from rlmon.service.metrics.rank import Rank, World
from tests.support.polling import wait_for
from tests.unit.liveness.support import T0, step_message
from tests.unit.liveness.test_service_liveness import Cluster

OOM = Outcome(OutcomeKind.EXCEPTION, "torch.OutOfMemoryError",
              "CUDA out of memory. Tried to allocate 2.00 GiB", ("train.py:41 in step",))
SIGTERM = Outcome(OutcomeKind.SIGNAL, signal="SIGTERM")


def _beat(run: str, dp: int, now: float, *, spans: tuple[tuple[str, float], ...] = (),
          last: int | None = None, outcome: Outcome | None = None, closing: bool = False,
          process: ProcessId | None = None, role: str = "actor", world: int = 2) -> Heartbeat:
    return Heartbeat(run, role, World(dp=world),
                     (RankBeat(Rank(dp=dp), tuple(OpenSpan(n, s) for n, s in spans), last),),
                     now, closing or outcome is not None, 1.0, outcome, process)


def _steps(tracker: LivenessTracker, run: str, n: int, role: str = "actor") -> float:
    now = T0
    for step in range(n):
        now += 1.0
        for dp in (0, 1):
            tracker.heard(run, role, Rank(dp=dp), 2, now)
            tracker.heartbeat(_beat(run, dp, now, spans=(("train", now - 0.5),), last=step,
                                    role=role), now)
        tracker.finalized(run, role, step, now)
    return now


def _state(tracker: LivenessTracker, run: str, now: float, role: str = "actor") -> RunState:
    tracker.evaluate(now)
    view = tracker.view(run, role, now)
    assert view is not None
    return view.state


def test_an_exception_fails_the_run_naming_rank_stage_step_and_cost() -> None:
    tracker = LivenessTracker()
    now = _steps(tracker, "r", 20) + 1
    tracker.heartbeat(_beat("r", 0, now, spans=(("rollout", now - 2), ("generate", now - 1)),
                            last=19), now)
    tracker.heartbeat(_beat("r", 0, now + 0.5, last=19, outcome=OOM), now + 0.5)
    assert _state(tracker, "r", now + 1) is RunState.FAILED
    view = tracker.view("r", "actor", now + 1)
    assert view is not None and [e.rank for e in view.ends] == [Rank(dp=0)]
    text = describe(view)
    assert "dp=0: torch.OutOfMemoryError: CUDA out of memory" in text
    assert "last seen in rollout/generate, last step 19" in text
    assert "train.py:41" in text and "GPU-hours" in text


def test_a_closing_heartbeat_naming_the_spans_it_failed_in_says_in_not_last_seen_in() -> None:
    tracker = LivenessTracker()
    now = _steps(tracker, "r", 20) + 1  # the last regular heartbeats said "train"
    tracker.heartbeat(_beat("r", 0, now, spans=(("update_actor", now - 0.1),
                                                ("backward", now - 0.05)), last=19,
                            outcome=OOM), now)
    assert _state(tracker, "r", now + 1) is RunState.FAILED
    text = describe(tracker.view("r", "actor", now + 1))  # type: ignore[arg-type]
    assert "dp=0: torch.OutOfMemoryError" in text
    assert "; in update_actor/backward, last step 19" in text and "last seen" not in text


def test_sigterm_is_preempted_and_a_crash_beside_it_is_failed() -> None:
    tracker = LivenessTracker()
    now = _steps(tracker, "p", 5) + 1
    for dp in (0, 1):
        tracker.heartbeat(_beat("p", dp, now, outcome=SIGTERM), now)
    assert _state(tracker, "p", now) is RunState.PREEMPTED
    # torchrun's way: one rank raised, the launcher then SIGTERMed the rest
    tracker = LivenessTracker()
    now = _steps(tracker, "f", 5) + 1
    tracker.heartbeat(_beat("f", 0, now, outcome=OOM), now)
    tracker.heartbeat(_beat("f", 1, now + 1, outcome=SIGTERM), now + 1)
    assert _state(tracker, "f", now + 1) is RunState.FAILED


def test_a_clean_close_and_exit_code_zero_finish() -> None:
    tracker = LivenessTracker()
    now = _steps(tracker, "c", 5) + 1
    tracker.heartbeat(_beat("c", 0, now, closing=True), now)
    tracker.heartbeat(_beat("c", 1, now, outcome=Outcome(OutcomeKind.CLEAN, exit_code=0)), now)
    assert _state(tracker, "c", now) is RunState.FINISHED


def test_the_other_roles_of_a_failed_run_are_failed_and_a_rerun_clears_it() -> None:
    tracker = LivenessTracker()
    now = _steps(tracker, "r", 5, role="driver")
    _steps(tracker, "r", 5, role="actor")
    now += 1
    tracker.heartbeat(_beat("r", 0, now, outcome=OOM, role="driver", world=1), now)
    assert _state(tracker, "r", now, "driver") is RunState.FAILED
    actor = tracker.view("r", "actor", now)
    assert actor is not None and actor.state is RunState.FAILED
    assert actor.ends == () and actor.failed_roles == ("driver",)
    # a late heartbeat of the old attempt (sent before the end) is not a rerun
    tracker.heartbeat(_beat("r", 0, now - 0.5, role="driver", world=1), now + 1)
    assert _state(tracker, "r", now + 1, "driver") is RunState.FAILED
    # the rerun reports: the failure is over
    tracker.heartbeat(_beat("r", 0, now + 60, role="driver", world=1), now + 60)
    assert _state(tracker, "r", now + 60, "driver") is not RunState.FAILED


def test_a_failed_run_stays_failed_across_an_aggregator_restart() -> None:
    tracker = LivenessTracker()
    now = _steps(tracker, "r", 5) + 1
    tracker.heartbeat(_beat("r", 1, now, spans=(("train", now - 1),), last=4), now)
    tracker.heartbeat(_beat("r", 1, now + 0.1, last=4, outcome=OOM), now + 0.1)
    tracker.evaluate(now + 1)
    restarted = LivenessTracker()
    saved = {key: json.loads(json.dumps(data)) for key, data in tracker.dump().items()}
    restarted.load(saved)  # as the watermark store gives it back
    view = restarted.view("r", "actor", now + 2)
    assert view is not None and view.state is RunState.FAILED
    assert view.ends[0].outcome == OOM and view.ends[0].stage == "train"
    assert restarted.evaluate(now + 2) == []  # said before the restart: nothing new


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
        proc.wait()


def _me(pid: int, host: str | None = None) -> ProcessId:
    return ProcessId(host or socket.gethostname(), pid)


def _silent(tracker: LivenessTracker, pid: int, host: str | None = None) -> float:
    """Five steps heard from process ``pid`` (on the real clock: the probe compares the
    process's start time with when it was first heard), then silence past the dead limit."""
    now = time.time()
    for step in range(5):
        now += 1.0
        for dp in (0, 1):
            tracker.heard("s", "actor", Rank(dp=dp), 2, now)
            tracker.heartbeat(_beat("s", dp, now, last=step, process=_me(pid, host)), now)
        tracker.finalized("s", "actor", step, now)
    return now + tracker.params.dead_after_seconds + 1


def test_a_stopped_process_is_frozen_not_dead_and_a_killed_one_is_dead(
        sleeper: subprocess.Popen[bytes]) -> None:
    tracker = LivenessTracker()
    now = _silent(tracker, sleeper.pid)
    os.kill(sleeper.pid, signal.SIGSTOP)
    wait_for(lambda: SameNodeProbe().sight(_me(sleeper.pid)).how.endswith("(SIGSTOP, Ctrl-Z)"),
             10.0, what="the child to stop")
    assert _state(tracker, "s", now) is RunState.FROZEN
    view = tracker.view("s", "actor", now)
    assert view is not None and view.processes is ProcessFate.ALIVE
    text = describe(view)
    assert "Processes still exist" in text and "stopped (SIGSTOP" in text
    assert "gone" not in text
    sleeper.kill()
    sleeper.wait()
    later = now + tracker.params.heartbeat_seconds  # probed again a heartbeat period later
    assert _state(tracker, "s", later) is RunState.DEAD
    view = tracker.view("s", "actor", later)
    assert view is not None and "Processes gone" in describe(view)


def test_a_process_the_probe_cannot_see_is_dead_said_unknown(
        sleeper: subprocess.Popen[bytes]) -> None:
    tracker = LivenessTracker()
    now = _silent(tracker, sleeper.pid, host="another-node")
    assert _state(tracker, "s", now) is RunState.DEAD
    view = tracker.view("s", "actor", now)
    assert view is not None and view.processes is ProcessFate.UNKNOWN
    text = describe(view)
    assert "Whether the processes still exist is unknown" in text
    assert "not on this node" in text


# --- through the service: alerts, cost, /metrics, `rlmon alerts`, a restart ---------------------


def _end(c: Cluster, run: str, outcomes: dict[int, Outcome | None],
         spans: tuple[tuple[str, float], ...] = ()) -> None:
    now = c.clock.wall()
    for dp, outcome in outcomes.items():
        if spans:
            c.core.heartbeat([_beat(run, dp, now - 0.5, spans=spans, last=c.steps[run] - 1)])
        c.core.heartbeat([_beat(run, dp, now, last=c.steps[run] - 1, outcome=outcome,
                                closing=True)])


def test_run_failed_pages_once_with_its_cost_survives_a_restart_and_a_rerun_resolves(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    c = Cluster(tmp_path)
    c.run(20, {"crash": {"step": True}, "term": {"step": True}, "done": {"step": True}})
    now = c.clock.wall()
    _end(c, "crash", {0: OOM}, spans=(("update_actor", now - 3),))
    _end(c, "term", {0: SIGTERM, 1: SIGTERM})
    _end(c, "done", {0: None, 1: Outcome(OutcomeKind.CLEAN)})
    c.run(60, {"crash": {"beat": False}, "term": {"beat": False}, "done": {"beat": False}})
    assert c.fired("crash") == [("RunFailed", "firing")]
    assert c.fired("term") == [("RunPreempted", "firing")]
    assert c.fired("done") == []
    failed = next(e for e in c.service.spine.commit.events if e.alert == "RunFailed")
    assert failed.severity == "critical" and failed.step == 19
    assert "torch.OutOfMemoryError: CUDA out of memory" in failed.detail
    assert "last seen in update_actor, last step 19" in failed.detail and "GPU-hours" in failed.detail
    assert "rerun" in failed.what_to_check and failed.cost_note
    preempted = next(e for e in c.service.spine.commit.events if e.alert == "RunPreempted")
    assert preempted.severity == "warning" and "killed by SIGTERM" in preempted.detail
    got = c.scrape()
    assert got[("rlmon_run_state", (("role", "actor"), ("run", "crash"), ("state", "failed")))] == 1
    assert got[("rlmon_run_state", (("role", "actor"), ("run", "term"),
                                    ("state", "preempted")))] == 1
    # how each ended, beside the state: the cause and the stage it ended in
    ends = {labels: v for (name, labels), v in got.items() if name == "rlmon_run_end_info"}
    assert ends == {
        (("cause", "torch.OutOfMemoryError"), ("role", "actor"), ("run", "crash"),
         ("stage", "update_actor"), ("state", "failed")): 1,
        (("cause", "SIGTERM"), ("role", "actor"), ("run", "term"), ("stage", ""),
         ("state", "preempted")): 1,
        (("cause", "clean"), ("role", "actor"), ("run", "done"), ("stage", ""),
         ("state", "finished")): 1}, ends
    c.restart_service()
    c.restart_aggregator()
    c.run(10, {"crash": {"beat": False}, "term": {"beat": False}, "done": {"beat": False}})
    assert c.fired("crash") == [("RunFailed", "firing")]  # not paged again
    c.service.close(0.0)
    assert main(["alerts", "--state-dir", str(tmp_path / "state"), "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    states = {r["run"]: r["state"] for r in found["liveness"]}
    assert states == {"crash": "failed", "term": "preempted"}
    assert "OutOfMemoryError" in next(r for r in found["liveness"]
                                      if r["run"] == "crash")["detail"]
    c.service = c._service()
    c.core.ingest([step_message("crash", 0, dp, 2, seq=1000 + dp, heartbeat=_beat(
        "crash", dp, c.clock.wall() + 1, last=0)) for dp in (0, 1)])
    c.run(3, {"crash": {"step": True}})
    assert c.fired("crash") == [("RunFailed", "firing"), ("RunFailed", "resolved")]
    resolved = [e for e in c.service.spine.commit.events if e.alert == "RunFailed"][-1]
    assert "rerun" in resolved.summary
    c.service.close(0.0)


def test_a_frozen_run_says_so_and_never_that_its_processes_are_gone(
        tmp_path: Path, sleeper: subprocess.Popen[bytes]) -> None:
    c = Cluster(tmp_path)
    c.clock.wall_now = time.time()  # the probe compares the process's start with real time
    me = _me(sleeper.pid)
    for _ in range(20):
        c.clock.advance(1.0)
        n = c.steps.get("f", 0)
        c.core.ingest([step_message("f", n, dp, 2, seq=n + 1, heartbeat=_beat(
            "f", dp, c.clock.wall(), last=n, process=me)) for dp in (0, 1)])
        c.steps["f"] = n + 1
        c.tick()
    os.kill(sleeper.pid, signal.SIGSTOP)
    c.run(60, {"f": {"beat": False}})
    assert c.fired("f") == [("RunFrozen", "firing")]
    frozen = next(e for e in c.service.spine.commit.events if e.alert == "RunFrozen")
    assert frozen.severity == "warning" and "Processes still exist" in frozen.detail
    assert "gone" not in frozen.detail + frozen.what_to_check
    # it comes back and closes cleanly: resolved, nothing else
    os.kill(sleeper.pid, signal.SIGCONT)
    c.run(3, {"f": {"step": True}})
    c.run(2, {"f": {"close": True}})
    assert c.fired("f") == [("RunFrozen", "firing"), ("RunFrozen", "resolved")]
    c.service.close(0.0)


def test_a_role_stopped_after_another_raised_is_failed_without_paging_twice() -> None:
    """A Ray job: the driver dies of its actor's exception, Ray's teardown then SIGTERMs the
    actor's process. The run failed; RunFailed belongs to the driver's role alone."""
    from rlmon.service.alerting.engine import AlertEngine
    from rlmon.service.alerting.liveness_alerts import liveness_events
    from rlmon.service.alerting.rules import liveness_rules

    tracker, engine = LivenessTracker(), AlertEngine(liveness_rules())
    now = _steps(tracker, "j", 5, role="driver")
    _steps(tracker, "j", 5, role="actor")
    raised = Outcome(OutcomeKind.EXCEPTION, "ray.exceptions.RayTaskError(ValueError)", "bad batch")
    tracker.heartbeat(_beat("j", 0, now + 1, outcome=raised, role="driver", world=1), now + 1)
    tracker.heartbeat(_beat("j", 0, now + 2, outcome=SIGTERM), now + 2)
    tracker.heartbeat(_beat("j", 1, now + 2, outcome=SIGTERM), now + 2)
    fired = [(e.role, e.alert) for view in tracker.evaluate(now + 3)
             for e in liveness_events(engine, view) if e.state == "firing"]
    assert fired == [("driver", "RunFailed")]
    actor = tracker.view("j", "actor", now + 3)
    assert actor is not None and actor.state is RunState.FAILED


def test_steps_finalized_together_then_a_hang_in_a_first_cold_span_stalls_at_the_floor() -> None:
    """Ten steps that reached the service in one batch (a slow first connection under load)
    measure no period; a hang in a span never entered before ("generate", a cold word) is still
    a stall after the floor, not after the cold allowance of a run's start."""
    tracker = LivenessTracker()  # defaults: floor 90 s, cold allowance 1 h
    now = T0 + 5.0
    for step in range(10):
        tracker.heard("r", "actor", Rank(dp=0), 1, now)
        tracker.finalized("r", "actor", step, now)
    beat = Heartbeat("r", "actor", World(dp=1), (RankBeat(
        Rank(dp=0), (OpenSpan("rollout", now), OpenSpan("generate", now)), 9),), now, False)
    for t in range(0, 120, 5):
        tracker.heartbeat(replace(beat, sent=now + t), now + t)
    assert _state(tracker, "r", now + 85) is not RunState.STALLED
    tracker.heartbeat(replace(beat, sent=now + 95), now + 95)
    assert _state(tracker, "r", now + 95) is RunState.STALLED
