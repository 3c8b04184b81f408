"""How a Ray-actor run ends, judged from what Ray says (rlmon.service.liveness.ray_ending), and
the end of training that is not a stall; on the tracker's simulated clock.

The probe here is scripted: it stands for Ray's GCS (the death cause, the failed tasks, a Ray
Job's status), which the Ray tests (tests/ray/test_ray_run_ends.py) ask for real."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from rlmon.service.alerting.engine import AlertEngine
from rlmon.service.alerting.liveness_alerts import liveness_events
from rlmon.service.alerting.rules import default_rules
from rlmon.service.contract.heartbeat import (
    Heartbeat,
    OpenSpan,
    Outcome,
    OutcomeKind,
    ProcessId,
    RankBeat,
)
from rlmon.service.liveness.process_probe import ProcessFate, Sighting
from rlmon.service.liveness.ray_ending import (
    ActorDeath,
    EndingKind,
    JobEnd,
    RayFacts,
    TaskFailure,
    judge_ending,
)
from rlmon.service.liveness.run_state import LivenessTracker, RunState, describe, end_cause
from rlmon.service.liveness.thresholds import LivenessParams
from rlmon.service.metrics.rank import Rank, World
from tests.unit.liveness.support import T0

CLEAN_OWNER = ("The actor is dead because its owner has died. Owner Id: 01000000ffff Owner Ip "
               "address: 10.0.0.2 Owner worker exit type: INTENDED_USER_EXIT Worker exit detail: "
               "Owner's worker process has crashed.")
TRACEBACK = ('ray::PolicyRank.step() (pid=4242, ip=10.0.0.2, actor_id=ab)\n'
             '  File "train.py", line 41, in step\n'
             '    raise ValueError("reward model returned NaN for every sample")\n'
             'ValueError: reward model returned NaN for every sample')
OOM = ("Task was killed due to the node running low on memory.\nMemory on the node (IP: "
       "10.0.0.7, ID: 3f2e) where the task (actor ID: ab, name=PolicyRank.__init__, pid=4242, "
       "memory used=6.10GB) was running was 7.32GB / 7.68GB (0.953), which exceeds the memory "
       "usage threshold of 0.95.")


def test_each_death_cause_reads_as_the_end_it_was() -> None:
    def judge(facts: RayFacts, reached: bool | None = None) -> tuple[EndingKind, str, str]:
        ending = judge_ending(facts, "its actor", reached)
        assert ending is not None, facts
        o = ending.outcome
        return ending.kind, ending.how, "" if o is None else f"{o.exc_type}: {o.message}"

    kind, how, _ = judge(RayFacts(ActorDeath("OWNER_DIED", CLEAN_OWNER)))
    assert kind is EndingKind.FINISHED and "driver ended normally" in how
    kind, how, _ = judge(RayFacts(ActorDeath("RAY_KILL", "killed by `ray.kill`")))
    assert kind is EndingKind.FINISHED and "ray.kill" in how
    # killed before the planned last step: not called an end (the silence is judged as before)
    assert judge_ending(RayFacts(ActorDeath("RAY_KILL")), "its actor", False) is None
    # the driver exited 1 after the rank raised: same death cause, the failed task tells
    kind, how, said = judge(RayFacts(ActorDeath("OWNER_DIED", CLEAN_OWNER), TaskFailure(
        "PolicyRank.step", "TASK_EXECUTION_EXCEPTION", TRACEBACK)))
    assert kind is EndingKind.FAILED and "PolicyRank.step" in how
    assert said == "ValueError: reward model returned NaN for every sample"
    kind, how, said = judge(RayFacts(ActorDeath("WORKER_DIED", "worker died", "10.0.0.7",
                                                oom=OOM)))
    assert kind is EndingKind.FAILED and "lack of memory on node 10.0.0.7" in how
    assert said.startswith("OutOfMemory:") and "7.32GB / 7.68GB (0.953)" in said
    kind, how, said = judge(RayFacts(ActorDeath(
        "WORKER_DIED", "The actor is dead because its worker process has died. Worker exit "
        "type: SYSTEM_ERROR", "10.0.0.2")))
    assert kind is EndingKind.FAILED and "worker process" in how and "10.0.0.2" in how
    kind, how, _ = judge(RayFacts(ActorDeath("NODE_DIED", "node died", "10.0.0.9",
                                             node_death="AUTOSCALER_DRAIN_PREEMPTED")))
    assert kind is EndingKind.PREEMPTED and "10.0.0.9" in how and "preempted" in how
    assert judge(RayFacts(ActorDeath("NODE_DIED", "node died", "10.0.0.9")))[0] is \
        EndingKind.FAILED
    # a Ray Job's status counts the same way, whatever the actor's death cause
    owner = ActorDeath("OWNER_DIED", CLEAN_OWNER)
    kind, how, said = judge(RayFacts(owner, job=JobEnd("raysubmit_1", "FAILED",
                                                       "Job entrypoint command failed with "
                                                       "exit code 1", 1)))
    assert kind is EndingKind.FAILED and "raysubmit_1 FAILED" in how
    assert judge(RayFacts(owner, job=JobEnd("s", "STOPPED", "stopped")))[0] is \
        EndingKind.PREEMPTED
    assert judge(RayFacts(owner, job=JobEnd("s", "SUCCEEDED")))[0] is EndingKind.FINISHED
    assert judge(RayFacts(job=JobEnd("s", "SUCCEEDED"), driver_gone=True))[0] is \
        EndingKind.FINISHED
    # what Ray does not say is not guessed
    assert judge_ending(RayFacts(ActorDeath("UNSPECIFIED")), "its actor") is None
    assert judge_ending(RayFacts(), "its actor") is None


class ScriptedRay:
    """Stands for Ray's GCS: each actor's facts once it is dead, as the test sets them."""

    def __init__(self) -> None:
        self.dead: dict[str, RayFacts] = {}
        self.asked = 0

    def check(self, processes: Sequence[ProcessId],
              since: Mapping[ProcessId, float]) -> dict[ProcessId, Sighting]:
        self.asked += 1
        out = {}
        for proc in processes:
            facts = self.dead.get(proc.actor_id)
            out[proc] = (Sighting(ProcessFate.GONE, f"Ray: actor {proc.actor_id} is DEAD", facts)
                         if facts is not None else
                         Sighting(ProcessFate.ALIVE, f"Ray: actor {proc.actor_id} is ALIVE"))
        return out


def _proc(dp: int) -> ProcessId:
    return ProcessId("node-a", 4000 + dp, "n1", "01000000", f"w{dp}", f"actor{dp}")


def _beat(dp: int, now: float, step: int | None, spans: tuple[tuple[str, float], ...] = (),
          total: int | None = None, raised: Outcome | None = None) -> Heartbeat:
    return Heartbeat("r", "actor", World(dp=2),
                     (RankBeat(Rank(dp=dp), tuple(OpenSpan(n, s) for n, s in spans), step),),
                     now, False, 1.0, None, _proc(dp), total, raised)


def _run(tracker: LivenessTracker, steps: int, total: int | None = None) -> float:
    now = T0
    for step in range(steps):
        now += 1.0
        for dp in (0, 1):
            tracker.heard("r", "actor", Rank(dp=dp), 2, now)
            tracker.heartbeat(_beat(dp, now, step, (("train", now - 0.5),), total), now)
        tracker.finalized("r", "actor", step, now)
    return now


def _pages(tracker: LivenessTracker, engine: AlertEngine, until: float, every: float = 1.0,
           start: float = T0) -> list[tuple[str, str, float]]:
    out = []
    now = start
    while now <= until:
        for view in tracker.evaluate(now):
            out += [(e.alert, e.state, now) for e in liveness_events(engine, view)]
        now += every
    return out


def test_a_failed_ray_job_names_its_entrypoint_s_exception_and_a_running_one_is_waited_for() -> None:
    """Ray appends the entrypoint's last logs to a failed job's message: its traceback's
    exception is the cause named. A driver that just ended under a job still RUNNING (its status
    is written next) is not yet judged: a clean OWNER_DIED would read finished."""
    owner = ActorDeath("OWNER_DIED", CLEAN_OWNER)
    logs = ("Job entrypoint command failed with exit code 1, last available logs (truncated to "
            "20,000 chars):\nstep 5 done\nTraceback (most recent call last):\n"
            '  File "/jobs/train.py", line 30, in <module>\n'
            '    raise RuntimeError("the learner diverged")\n'
            "RuntimeError: the learner diverged\n")
    ending = judge_ending(RayFacts(owner, job=JobEnd("raysubmit_2", "FAILED", logs, 1)),
                          "its actor")
    assert ending is not None and ending.kind is EndingKind.FAILED and ending.outcome is not None
    assert (ending.outcome.exc_type, ending.outcome.message) == (
        "RuntimeError", "the learner diverged")
    assert ending.outcome.frames == ("/jobs/train.py:30 in <module>",)
    assert ending.how == ("Ray Job raysubmit_2 FAILED: Job entrypoint command failed with exit "
                          "code 1")
    for status in ("PENDING", "RUNNING"):
        assert judge_ending(RayFacts(owner, job=JobEnd("s", status)), "its actor") is None
    # what the job's status cannot change is judged at once
    worker = judge_ending(RayFacts(ActorDeath("WORKER_DIED", "died"), job=JobEnd("s", "RUNNING")),
                          "its actor")
    assert worker is not None and worker.kind is EndingKind.FAILED


def test_a_driver_that_returns_finishes_the_run_within_two_heartbeats_and_pages_nothing() -> None:
    ray = ScriptedRay()
    tracker = LivenessTracker(LivenessParams(), probe=ray)
    engine = AlertEngine(default_rules())
    last = _run(tracker, 30, total=30)
    for dp in (0, 1):  # the driver returned: Ray ended both actors with it
        ray.dead[f"actor{dp}"] = RayFacts(ActorDeath("OWNER_DIED", CLEAN_OWNER))
    pages = _pages(tracker, engine, last + 120, start=last + 1)
    assert pages == []
    view = tracker.view("r", "actor", last + 120)
    assert view is not None and view.state is RunState.FINISHED
    assert view.since - last <= 2 * tracker.params.heartbeat_seconds + 1.0
    assert describe(view) == ("Finished at step 29, the last of 30 planned steps: its driver "
                              "ended normally and Ray ended its actor with it (Ray: OWNER_DIED)")
    short = replace(view, last_step=17)
    assert describe(short).startswith("Finished at step 17, short of the 30 planned steps: ")
    assert describe(replace(view, total_steps=None)).startswith("Finished at step 29: its ")
    assert end_cause(view) == ("owner_died", "")  # rlmon_run_end_info's labels
    for how, cause in (("its driver killed its actor with ray.kill (Ray: RAY_KILL)", "ray_kill"),
                       ("Ray Job raysubmit_1 SUCCEEDED; Ray ended its actor with it",
                        "ray_job_succeeded"), ("", "clean")):
        assert end_cause(replace(view, ended_how=how)) == (cause, "")
    assert end_cause(replace(view, state=RunState.RUNNING)) == ("", "")


def test_a_rank_that_raised_is_named_with_its_exception_and_stage_from_its_heartbeat() -> None:
    ray = ScriptedRay()
    tracker = LivenessTracker(LivenessParams(), probe=ray)
    engine = AlertEngine(default_rules())
    last = _run(tracker, 10)
    raised = Outcome(OutcomeKind.EXCEPTION, "ValueError",
                     "reward model returned NaN for every sample", ("train.py:41 in score",))
    # rlmon's method wrapper sent this at once, with the spans open where it was raised
    tracker.heartbeat(_beat(1, last + 0.5, 9, (("reward", last + 0.1),), raised=raised),
                      last + 0.5)
    for dp in (0, 1):  # then the driver exited 1; Ray's death cause reads as a clean exit
        ray.dead[f"actor{dp}"] = RayFacts(ActorDeath("OWNER_DIED", CLEAN_OWNER))
    pages = _pages(tracker, engine, last + 60, start=last + 1)
    assert [(a, s) for a, s, _ in pages] == [("RunFailed", "firing")]
    assert pages[0][2] - last <= 2 * tracker.params.heartbeat_seconds + 2.0
    view = tracker.view("r", "actor", last + 60)
    assert view is not None and view.state is RunState.FAILED
    text = describe(view)
    assert text.startswith("dp=1: ValueError: reward model returned NaN for every sample")
    assert "rlmon's method wrapper" in text and "in reward, last step 9" in text


RAISED = Outcome(OutcomeKind.EXCEPTION, "ValueError", "reward model returned NaN for every sample",
                 ("train.py:41 in score",))


def _raised_and_silent(tracker: LivenessTracker, engine: AlertEngine, last: float
                       ) -> tuple[list[tuple[str, str, float, str]], float, float]:
    """Rank 1's wrapped method raised after step 9; both actors live on and heartbeat, no step
    follows and Ray says nothing, until 30 s past the stall threshold: (the pages with their
    time and detail, the time reached, the threshold)."""
    threshold = tracker.view("r", "actor", last).threshold  # type: ignore[union-attr]
    now, pages = last, []
    # the wrapper's heartbeat names the spans open where it raised; the later ones none
    spans: tuple[tuple[str, float], ...] = (("train", last + 0.05), ("reward", last + 0.1))
    while now < last + threshold + 30:
        now += 0.5
        tracker.heartbeat(_beat(1, now, 9, spans, raised=RAISED), now)
        spans = ()
        tracker.heartbeat(_beat(0, now, 9), now)
        for view in tracker.evaluate(now):
            pages += [(e.alert, e.state, now, e.detail) for e in liveness_events(engine, view)]
    return pages, now, threshold


def test_a_rank_that_raised_fails_the_run_at_the_stall_threshold_if_ray_has_not_said_yet() -> None:
    """On a loaded machine Ray's account of the actor can come after the stall threshold: the
    run stopped because a rank raised, so it pages RunFailed naming the exception, never
    RunStalled, and Ray's later account is the same incident."""
    ray = ScriptedRay()
    tracker = LivenessTracker(LivenessParams(), probe=ray)
    engine = AlertEngine(default_rules())
    last = _run(tracker, 10)
    pages, now, threshold = _raised_and_silent(tracker, engine, last)
    assert [(a, s) for a, s, _, _ in pages] == [("RunFailed", "firing")]
    assert last + threshold < pages[0][2] <= last + threshold + 1.0
    text = pages[0][3]
    assert text.startswith("dp=1: ValueError: reward model returned NaN for every sample")
    assert "no step followed" in text and "in train/reward, last step 9" in text
    view = tracker.view("r", "actor", now)
    assert view is not None and view.state is RunState.FAILED and view.ended_at == last + 0.5
    assert end_cause(view) == ("ValueError", "train/reward")
    for dp in (0, 1):  # then the driver exits 1 and Ray ends both actors: the same incident
        ray.dead[f"actor{dp}"] = RayFacts(ActorDeath("OWNER_DIED", CLEAN_OWNER))
    assert _pages(tracker, engine, now + 30, start=now + 1) == []
    view = tracker.view("r", "actor", now + 30)
    assert view is not None and view.state is RunState.FAILED
    assert "then its driver ended normally" in describe(view)


def test_a_run_that_steps_again_after_a_handled_raise_resolves_or_never_pages() -> None:
    """The driver handled the exception: stepping again after the threshold resolves RunFailed
    as progress resumed (no rerun happened); stepping again before it pages nothing."""
    tracker = LivenessTracker(LivenessParams(), probe=ScriptedRay())
    engine = AlertEngine(default_rules())
    pages, now, threshold = _raised_and_silent(tracker, engine, _run(tracker, 10))
    step = 10
    for _ in range(3):
        for dp in (0, 1):
            tracker.heartbeat(_beat(dp, now, step), now)
        tracker.finalized("r", "actor", step, now)
        pages += [(e.alert, e.state, now, e.summary) for v in tracker.evaluate(now)
                  for e in liveness_events(engine, v)]
        now, step = now + 1.0, step + 1
    assert [(a, s) for a, s, _, _ in pages] == [("RunFailed", "firing"), ("RunFailed", "resolved")]
    assert pages[1][3].endswith("(progress resumed)"), pages[1][3]

    tracker = LivenessTracker(LivenessParams(), probe=ScriptedRay())
    engine = AlertEngine(default_rules())
    last = _run(tracker, 10)
    tracker.heartbeat(_beat(1, last + 0.5, 9, (("reward", last + 0.1),), raised=RAISED),
                      last + 0.5)
    assert _pages(tracker, engine, last + 2, start=last + 1) == []
    now, step = last + 2.5, 10
    while now < last + threshold + 30:  # one step a second again
        for dp in (0, 1):
            tracker.heartbeat(_beat(dp, now, step), now)
        tracker.finalized("r", "actor", step, now)
        assert [liveness_events(engine, v) for v in tracker.evaluate(now)] in ([], [[]])
        now, step = now + 1.0, step + 1
    view = tracker.view("r", "actor", now)
    assert view is not None and view.state is RunState.RUNNING and view.ends == ()

    # the driver handled it and said the run finished (finish_run): finished, nothing paged
    tracker = LivenessTracker(LivenessParams(), probe=ScriptedRay())
    engine = AlertEngine(default_rules())
    last = _run(tracker, 10)
    tracker.heartbeat(_beat(1, last + 0.5, 9, (("reward", last + 0.1),), raised=RAISED),
                      last + 0.5)
    tracker.finish("r", last + 1.0)
    assert _pages(tracker, engine, last + threshold + 30, start=last + 1) == []
    view = tracker.view("r", "actor", last + threshold + 30)
    assert view is not None and view.state is RunState.FINISHED and view.ends == ()


def test_a_failed_task_names_the_exception_without_any_wrapper() -> None:
    ray = ScriptedRay()
    tracker = LivenessTracker(LivenessParams(), probe=ray)
    last = _run(tracker, 10)
    ray.dead["actor1"] = RayFacts(ActorDeath("OWNER_DIED", CLEAN_OWNER), TaskFailure(
        "PolicyRank.step", "TASK_EXECUTION_EXCEPTION", TRACEBACK))
    ray.dead["actor0"] = RayFacts(ActorDeath("OWNER_DIED", CLEAN_OWNER))
    tracker.evaluate(last + 15)
    view = tracker.view("r", "actor", last + 15)
    assert view is not None and view.state is RunState.FAILED
    assert [e.rank for e in view.ends] == [Rank(dp=1)]
    assert "ValueError: reward model returned NaN" in describe(view)
    assert "Ray: PolicyRank.step of its actor raised ValueError" in describe(view)


class TasksRay(ScriptedRay):
    """Ray's GCS with its task events too: the live actors whose last task failed."""

    def __init__(self) -> None:
        super().__init__()
        self.failed: dict[str, TaskFailure] = {}
        self.tasks_asked = 0

    def failed_tasks(self, actor_ids: Sequence[str]) -> dict[str, TaskFailure]:
        self.tasks_asked += 1
        return {a: self.failed[a] for a in actor_ids if a in self.failed}


def _idle(tracker: LivenessTracker, engine: AlertEngine, last: float, until: float,
          every: float = 0.5) -> list[tuple[str, str, float]]:
    """Both actors live on, heartbeating in no span (their driver calls nothing): when pages
    came, judged every ``every`` seconds."""
    now, pages = last, []
    while now < until:
        now += every
        for dp in (0, 1):
            tracker.heartbeat(_beat(dp, now, 9), now)
        for view in tracker.evaluate(now):
            pages += [(e.alert, e.state, now) for e in liveness_events(engine, view)]
    return pages


def test_an_unwrapped_raise_that_ray_knows_fails_the_run_at_the_stall_threshold() -> None:
    """Rank 1's method raised with no rlmon wrapper around it; its driver has not ended yet (a
    loaded machine, a driver that lingers), so Ray has not torn the actors down: its task events
    are the only word. At the stall threshold the run fails naming the exception, never stalls;
    without that word, or with a step after the failed task, it stalls as before."""
    ray = TasksRay()
    tracker = LivenessTracker(LivenessParams(), probe=ray)
    engine = AlertEngine(default_rules())
    last = _run(tracker, 10)
    ray.failed["actor1"] = TaskFailure("Rank.step", "TASK_EXECUTION_EXCEPTION", TRACEBACK)
    pages = _idle(tracker, engine, last, last + 150)
    assert [(a, s) for a, s, _ in pages] == [("RunFailed", "firing")]
    threshold = LivenessParams().stall_floor_seconds
    assert threshold < pages[0][2] - last <= threshold + 1.0
    view = tracker.view("r", "actor", last + 150)
    assert view is not None and view.state is RunState.FAILED
    text = describe(view)
    assert "dp=1: ValueError: reward model returned NaN for every sample" in text, text
    assert "Ray: Rank.step of its actor raised ValueError (a failed task) and no step " \
           "followed" in text, text
    assert ray.tasks_asked <= 2  # asked once the run was overdue, not on every heartbeat before
    # Ray says nothing failed: a stall, as before; Ray's task events (every one the GCS keeps)
    # are read three times, a heartbeat period apart, not every period while the stall lasts
    quiet = TasksRay()
    tracker = LivenessTracker(LivenessParams(), probe=quiet)
    engine = AlertEngine(default_rules())
    pages = _idle(tracker, engine, _run(tracker, 10), last + 600)
    assert [(a, s) for a, s, _ in pages] == [("RunStalled", "firing")]
    assert quiet.tasks_asked == 3


def test_a_step_after_a_failed_task_ray_told_of_clears_it() -> None:
    ray = TasksRay()
    tracker = LivenessTracker(LivenessParams(), probe=ray)
    last = _run(tracker, 10)
    ray.failed["actor1"] = TaskFailure("Rank.step", "TASK_EXECUTION_EXCEPTION", TRACEBACK)
    _idle(tracker, AlertEngine(default_rules()), last, last + 91)  # overdue: Ray's word taken
    view = tracker.view("r", "actor", last + 91)
    assert view is not None and view.state is RunState.FAILED
    del ray.failed["actor1"]
    # the driver handled it and called again: a step followed, the run goes on
    for dp in (0, 1):
        tracker.heard("r", "actor", Rank(dp=dp), 2, last + 92)
        tracker.heartbeat(_beat(dp, last + 92, 10, (("train", last + 91.5),)), last + 92)
    tracker.finalized("r", "actor", 10, last + 92)
    tracker.evaluate(last + 93)
    view = tracker.view("r", "actor", last + 93)
    assert view is not None and view.state is RunState.RUNNING


def test_an_oom_kill_and_a_lost_node_name_node_and_memory() -> None:
    ray = ScriptedRay()
    tracker = LivenessTracker(LivenessParams(), probe=ray)
    last = _run(tracker, 10)
    ray.dead["actor0"] = RayFacts(ActorDeath("WORKER_DIED", "", "10.0.0.7", oom=OOM))
    ray.dead["actor1"] = RayFacts(ActorDeath("OWNER_DIED", CLEAN_OWNER))
    tracker.evaluate(last + 15)
    view = tracker.view("r", "actor", last + 15)
    assert view is not None and view.state is RunState.FAILED
    assert "OutOfMemory: Ray's memory monitor killed the worker on node 10.0.0.7, memory " \
           "7.32GB / 7.68GB (0.953) in use" in describe(view)
    ray = ScriptedRay()
    tracker = LivenessTracker(LivenessParams(), probe=ray)
    last = _run(tracker, 10)
    for dp in (0, 1):
        ray.dead[f"actor{dp}"] = RayFacts(ActorDeath(
            "NODE_DIED", "node died", "10.0.0.9", node_death="AUTOSCALER_DRAIN_PREEMPTED"))
    tracker.evaluate(last + 15)
    view = tracker.view("r", "actor", last + 15)
    assert view is not None and view.state is RunState.PREEMPTED
    assert "Ray: node 10.0.0.9 of its actor was preempted" in describe(view)


def test_where_ray_cannot_tell_the_silence_is_judged_as_before() -> None:
    class Unreachable:
        def check(self, processes: Sequence[ProcessId],
                  since: Mapping[ProcessId, float]) -> dict[ProcessId, Sighting]:
            return {p: Sighting(ProcessFate.UNKNOWN, "Ray could not be asked: GCS unreachable")
                    for p in processes}

    tracker = LivenessTracker(LivenessParams(), probe=Unreachable())
    engine = AlertEngine(default_rules())
    last = _run(tracker, 10)
    pages = _pages(tracker, engine, last + 40, start=last + 1)
    assert [(a, s) for a, s, _ in pages] == [("RunDied", "firing")]
    view = tracker.view("r", "actor", last + 40)
    assert view is not None and "Ray could not be asked: GCS unreachable" in describe(view)


def test_the_end_of_training_is_not_a_stall_but_a_hung_final_save_pages_later() -> None:
    params = LivenessParams(final_seconds=3600.0, save_span_seconds=1800.0)
    tracker = LivenessTracker(params, probe=ScriptedRay())
    engine = AlertEngine(default_rules())
    last = _run(tracker, 30, total=30)
    # every rank alive, in the final save, for over an hour
    now = last
    pages = []
    while now < last + 4000:
        now += 5.0
        for dp in (0, 1):
            tracker.heartbeat(_beat(dp, now, 29, (("save_checkpoint", last + 0.5),), 30), now)
        for view in tracker.evaluate(now):
            pages += [(e.alert, e.state, now) for e in liveness_events(engine, view)]
    assert [(a, s) for a, s, _ in pages] == [("RunStalled", "firing")]
    # not at the 90 s stall floor: at the final allowance (the save span's is shorter)
    assert 3600.0 <= pages[0][2] - last <= 3600.0 + 10.0


def test_a_save_mid_run_has_its_own_allowance() -> None:
    params = LivenessParams(save_span_seconds=600.0)
    tracker = LivenessTracker(params, probe=ScriptedRay())
    engine = AlertEngine(default_rules())
    last = _run(tracker, 10, total=100)
    now, pages = last, []
    while now < last + 900:
        now += 5.0
        for dp in (0, 1):
            tracker.heartbeat(_beat(dp, now, 9, (("eval", last + 0.5),), 100), now)
        for view in tracker.evaluate(now):
            pages += [(e.alert, e.state, now) for e in liveness_events(engine, view)]
    assert [(a, s) for a, s, _ in pages] == [("RunStalled", "firing")]
    assert 600.0 <= pages[0][2] - last <= 610.0
    # the same silence outside a save span pages at the stall floor
    tracker = LivenessTracker(params, probe=ScriptedRay())
    engine = AlertEngine(default_rules())
    last = _run(tracker, 10, total=100)
    now, pages = last, []
    while now < last + 200:
        now += 5.0
        for dp in (0, 1):
            tracker.heartbeat(_beat(dp, now, 9, (("train", last + 0.5),), 100), now)
        for view in tracker.evaluate(now):
            pages += [(e.alert, e.state, now) for e in liveness_events(engine, view)]
    assert [(a, s) for a, s, _ in pages] == [("RunStalled", "firing")]
    assert pages[0][2] - last <= params.stall_floor_seconds + 10.0


def test_ray_s_sigterm_of_an_actor_whose_driver_ended_is_not_a_preemption() -> None:
    """Ray SIGTERMs the actors of a driver that ended: their closing heartbeats say SIGTERM,
    and Ray's death cause says why; a SIGTERM Ray cannot explain stays a preemption."""
    sigterm = Outcome(OutcomeKind.SIGNAL, signal="SIGTERM")
    for owner_ended in (True, False):
        ray = ScriptedRay()
        tracker = LivenessTracker(LivenessParams(), probe=ray)
        engine = AlertEngine(default_rules())
        last = _run(tracker, 30, total=30)
        for dp in (0, 1):
            tracker.heartbeat(Heartbeat("r", "actor", World(dp=2), (RankBeat(Rank(dp=dp)),),
                                        last + 0.2, True, 1.0, sigterm, _proc(dp)), last + 0.3)
            if owner_ended:
                ray.dead[f"actor{dp}"] = RayFacts(ActorDeath("OWNER_DIED", CLEAN_OWNER))
        pages = _pages(tracker, engine, last + 60, start=last + 1)
        view = tracker.view("r", "actor", last + 60)
        assert view is not None
        if owner_ended:
            assert pages == [] and view.state is RunState.FINISHED
        else:
            assert [(a, s) for a, s, _ in pages] == [("RunPreempted", "firing")]
            assert view.state is RunState.PREEMPTED
            assert pages[0][2] - last <= tracker.params.dead_after_seconds + 2.0


def test_a_run_s_state_is_its_worst_role_s_and_finished_once_every_role_is() -> None:
    from rlmon.service.liveness.run_level import run_level

    assert run_level([("actor", "finished", "Finished at step 29: a"),
                      ("reward", "finished", "Finished at step 29: b")]) == (
        "finished", "actor: Finished at step 29: a")
    assert run_level([("actor", "finished", "x"), ("rollout", "running", "")]) == ("running", "")
    assert run_level([("actor", "finished", "x"), ("driver", "failed", "dp=0: ValueError"),
                      ("reward", "preempted", "y")]) == ("failed", "driver: dp=0: ValueError")
    assert run_level([]) == ("running", "")
