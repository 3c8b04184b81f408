"""Ray's own knowledge of whether a silent run's processes still exist (docs/liveness.md).

Asked by the aggregator's liveness tracker before it calls a silent run dead
(:class:`~rlmon.service.liveness.process_probe.ProcessProbe`). Ray's GCS knows, for a Reporter
in an actor, the actor's state (``DEAD`` once its worker process exited or was killed, its node
lost), and for a Reporter in a driver, whether the job's driver is still connected (a driver
that exited or was killed is marked dead within seconds). Neither says whether a live process is
running or stopped; the same-node check (``/proc``) says that for a process on the aggregator's
node, and answers for the processes Ray does not know (a script not under Ray, another
cluster). The GCS is read directly (``ray._private.state``: no dashboard needed), each answer
bounded by Ray's GCS client timeouts; any error is ``unknown``, never ``gone``.

For a dead actor it also gathers what Ray knows of how it ended
(:class:`~rlmon.service.liveness.ray_ending.RayFacts`, judged by the tracker): its death cause,
its last task when that task failed (the GCS's task events, the same store ``ray list tasks``
reads), and the status of its Ray Job (``ray job submit``; the job's submission id is in the job
table, its status in the GCS's key-value store, where the job manager writes it). A driver's
process that exited is told by its Ray Job's status too.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from rlmon.service.contract.heartbeat import ProcessId
from rlmon.service.liveness.process_probe import ProcessFate, SameNodeProbe, Sighting
from rlmon.service.liveness.ray_ending import ActorDeath, JobEnd, RayFacts, TaskFailure

__all__ = ["RayProcessProbe"]

_MAX_ENDED = 4096  # dead actors whose end is remembered


class RayProcessProbe:
    """Ray's GCS first (actors, the job's driver), then the same node's ``/proc``."""

    def __init__(self, local: SameNodeProbe | None = None) -> None:
        self.local = local or SameNodeProbe()
        # a dead actor's death cause and last task never change: read once (bounded)
        self._ended: dict[str, Sighting] = {}
        self._tasks: dict[str, TaskFailure | None] | None = None
        self._info: tuple[str, dict[str, Any]] | None = None  # the actor table entry just read

    def check(self, processes: Sequence[ProcessId],
              since: Mapping[ProcessId, float]) -> dict[ProcessId, Sighting]:
        jobs: dict[str, tuple[bool, str]] = {}
        self._tasks = None  # the task events are read at most once per check
        out = {}
        for proc in processes:
            ray_says: Sighting | None = None
            try:
                driver = bool(proc.job_id) and not proc.actor_id
                if not jobs and (driver or proc.actor_id in self._ended
                                 or (bool(proc.actor_id) and self._dead(proc.actor_id))):
                    jobs = self._jobs()  # only for what ended: a driver, a dead actor
                if proc.actor_id:
                    ray_says = self._actor(proc.actor_id)
                    if ray_says.facts is not None and proc.job_id:
                        ray_says = replace(ray_says, facts=replace(
                            ray_says.facts, job=self._job_end(jobs.get(proc.job_id))))
                elif proc.job_id:
                    dead, submission = jobs.get(proc.job_id, (None, ""))
                    if dead is not None:
                        facts = RayFacts(job=self._job_end((dead, submission)),
                                         driver_gone=True) if dead else None
                        ray_says = Sighting(
                            ProcessFate.GONE if dead else ProcessFate.ALIVE,
                            f"Ray: job {proc.job_id}'s driver "
                            + ("exited" if dead else "is still connected"), facts)
            except Exception as exc:  # the GCS unreachable, an older Ray: say so, judge locally
                ray_says = Sighting(ProcessFate.UNKNOWN, f"Ray could not be asked: {exc}")
            out[proc] = _combine(ray_says, self.local.sight(proc, since.get(proc)))
        return out

    def _dead(self, actor_id: str) -> bool:
        """Whether the actor is dead (its table entry kept for :meth:`_actor`)."""
        from ray._private.state import state

        self._info = (actor_id, state.actor_table(actor_id))
        return str(self._info[1].get("State", "")) == "DEAD" if self._info[1] else False

    def _actor(self, actor_id: str) -> Sighting:
        known = self._ended.get(actor_id)
        if known is not None:
            return known
        from ray._private.state import state

        cached = self._info
        info: dict[str, Any] = (cached[1] if cached is not None and cached[0] == actor_id
                                else state.actor_table(actor_id))
        self._info = None
        if not info:
            return Sighting(ProcessFate.UNKNOWN, f"Ray: no actor {actor_id}")
        status = str(info.get("State", ""))
        if status in ("DEAD", "RESTARTING"):
            how = (f"Ray: actor {actor_id} is {status} (its worker process pid "
                   f"{info.get('Pid')} exited)")
            if status != "DEAD":
                return Sighting(ProcessFate.GONE, how)
            death, task = _death(info.get("DeathCause"))
            if death is None:  # an older Ray, or no cause kept: judged by silence, as before
                return Sighting(ProcessFate.GONE, how + "; Ray gave no death cause")
            if task is None and death.reason in ("OWNER_DIED", "RAY_KILL"):
                # the ends that read as clean: only its last task tells a raise from a finish
                task = self._last_failed_task(actor_id)
            seen = Sighting(ProcessFate.GONE, how, RayFacts(death, task))
            while len(self._ended) >= _MAX_ENDED:
                del self._ended[next(iter(self._ended))]
            self._ended[actor_id] = seen
            return seen
        return Sighting(ProcessFate.ALIVE, f"Ray: actor {actor_id} is {status}")

    def failed_tasks(self, actor_ids: Sequence[str]) -> dict[str, TaskFailure]:
        """Of these live actors, those whose last task failed (a method that raised), read
        afresh from the GCS's task events: asked of idle ranks of an overdue run."""
        wanted = set(actor_ids)
        return {actor: task for actor, task in _last_tasks().items()
                if actor in wanted and task is not None}

    def _last_failed_task(self, actor_id: str) -> TaskFailure | None:
        """The actor's last task, when it failed (a method that raised)."""
        if self._tasks is None:
            try:
                self._tasks = _last_tasks()
            except Exception:  # task events off or unreadable: the death cause alone decides
                self._tasks = {}
        return self._tasks.get(actor_id)

    @staticmethod
    def _jobs() -> dict[str, tuple[bool, str]]:
        """Job id -> (its driver exited, its Ray Job submission id or "")."""
        from ray._private.state import state
        from ray.core.generated import gcs_pb2

        accessor = state._connect_and_get_accessor()
        out = {}
        for raw in accessor.get_job_table(skip_submission_job_info_field=True,
                                          skip_is_running_tasks_field=True):
            entry = gcs_pb2.JobTableData.FromString(raw)  # type: ignore[attr-defined]
            out[entry.job_id.hex()] = (bool(entry.is_dead),
                                       str(entry.config.metadata.get("job_submission_id", "")))
        return out

    @staticmethod
    def _job_end(job: tuple[bool, str] | None) -> JobEnd | None:
        """A Ray Job's status, read where its job manager keeps it (the GCS key-value store)."""
        if job is None or not job[1]:
            return None
        from ray.experimental.internal_kv import _internal_kv_get

        raw = _internal_kv_get(f"_ray_internal_job_info_{job[1]}", namespace="job")
        if not raw:
            return None
        info = json.loads(raw)
        code = info.get("driver_exit_code")
        return JobEnd(job[1], str(info.get("status", "")), str(info.get("message") or ""),
                      int(code) if isinstance(code, int) else None)


def _death(cause: Any) -> tuple[ActorDeath | None, TaskFailure | None]:
    """An ``ActorDeathCause`` as :class:`ActorDeath` (and the actor's constructor's failure)."""
    if cause is None:
        return None, None
    from ray.core.generated import common_pb2

    if cause.HasField("creation_task_failure_context"):
        text = cause.creation_task_failure_context.formatted_exception_string
        return ActorDeath("CREATION_TASK_ERROR", text), TaskFailure(
            "__init__", "TASK_EXECUTION_EXCEPTION", text)
    oom = cause.oom_context.error_message if cause.HasField("oom_context") else ""
    if not cause.HasField("actor_died_error_context"):
        return (ActorDeath("WORKER_DIED", oom, oom=oom) if oom else None), None
    ctx = cause.actor_died_error_context
    node_death, node_message = "", ""
    if ctx.HasField("node_death_info"):
        node_death = common_pb2.NodeDeathInfo.Reason.Name(  # type: ignore[attr-defined]
            ctx.node_death_info.reason)
        node_message = ctx.node_death_info.reason_message
    reason = common_pb2.ActorDiedErrorContext.Reason.Name(ctx.reason)  # type: ignore[attr-defined]
    return ActorDeath(reason, ctx.error_message, ctx.node_ip_address, ctx.pid, oom, node_death,
                      node_message), None


def _last_tasks() -> dict[str, TaskFailure | None]:
    """Per actor (hex id), its last task when it failed: the GCS's task events (bounded by
    Ray's own store), the latest state change of each actor's tasks deciding which is last."""
    from ray._private.state import state
    from ray.core.generated import common_pb2

    failed = common_pb2.TaskStatus.Value("FAILED")  # type: ignore[attr-defined]
    last: dict[str, tuple[int, TaskFailure | None]] = {}
    for event in state._get_all_task_events():
        actor = event.task_info.actor_id.hex() if event.HasField("task_info") else ""
        if not actor or not event.HasField("state_updates"):
            continue
        updates = event.state_updates
        stamps = dict(updates.state_ts_ns)
        if not stamps:
            continue
        at = max(stamps.values())
        if actor in last and last[actor][0] >= at:
            continue
        failure = None
        if failed in stamps and updates.HasField("error_info"):
            info = updates.error_info
            failure = TaskFailure(event.task_info.name,
                                  common_pb2.ErrorType.Name(  # type: ignore[attr-defined]
                                      info.error_type), info.error_message)
        last[actor] = (at, failure)
    return {actor: failure for actor, (_, failure) in last.items()}


def _combine(ray_says: Sighting | None, local: Sighting) -> Sighting:
    """Gone if either knows it gone; the same node's word when it sees the process (it tells
    stopped from running); Ray's otherwise; unknown with both reasons when neither knows."""
    if ray_says is not None and ray_says.fate is ProcessFate.GONE:
        return ray_says
    if local.fate is not ProcessFate.UNKNOWN:
        return local
    if ray_says is not None and ray_says.fate is ProcessFate.ALIVE:
        return ray_says
    reasons = "; ".join(s.how for s in (ray_says, local) if s is not None)
    return Sighting(ProcessFate.UNKNOWN, reasons)
