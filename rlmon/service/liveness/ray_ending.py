"""How a rank's actor (or a driver) ended, as Ray saw it: finished, failed or preempted.

A Reporter inside a Ray actor rarely gets to say how its process ended: at the end of a run the
driver returns (or kills its actors with ``ray.kill``) and Ray tears the actor down without running its
``atexit`` hooks. Ray keeps what happened (docs/liveness.md, "How a run ends"):

* the actor's death cause: ``OWNER_DIED`` (its driver ended; the owner's exit type says whether
  normally), ``RAY_KILL``, ``WORKER_DIED`` (its process crashed or was killed, the memory monitor's
  kill among them), ``NODE_DIED`` (its node died, or was drained for preemption);
* the actor's failed tasks: a method that raised, with the whole traceback. A driver whose
  ``ray.get`` raised on it exits 1, yet leaves the same death cause and the same job status as a
  clean exit, so the last task of the actor is what tells the two apart;
* a Ray Job's status (``SUCCEEDED``, ``FAILED``, ``STOPPED``) and message, for a driver started with
  ``ray job submit``.

The Ray side (:mod:`rlmon.actors.process_probe`) gathers these as :class:`RayFacts`; this module
judges them, without Ray, into a :class:`RayEnding`: a sentence saying how the rank ended and,
for a failure, the :class:`~rlmon.service.contract.heartbeat.Outcome` its alert names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from enum import StrEnum

from rlmon.service.contract.heartbeat import MAX_OUTCOME_FRAMES, Outcome, OutcomeKind

__all__ = ["ActorDeath", "EndingKind", "JobEnd", "RayEnding", "RayFacts", "TaskFailure",
           "judge_ending"]


@dataclass(frozen=True, slots=True)
class ActorDeath:
    """``death_cause`` of a dead actor (``ActorDiedErrorContext`` and the OOM context)."""

    reason: str  # OWNER_DIED, RAY_KILL, WORKER_DIED, NODE_DIED, OUT_OF_SCOPE, REF_DELETED, ...
    message: str = ""
    node_ip: str = ""
    pid: int = 0
    oom: str = ""  # the memory monitor's message, when it killed the worker
    node_death: str = ""  # the node's death reason (AUTOSCALER_DRAIN_PREEMPTED, ...)
    node_death_message: str = ""


@dataclass(frozen=True, slots=True)
class TaskFailure:
    """The actor's last task, when it failed: a method that raised, with its traceback."""

    name: str  # "PolicyRank.step"
    error_type: str  # "TASK_EXECUTION_EXCEPTION", "WORKER_DIED", ...
    message: str  # Ray's error text: the remote traceback, ending in "ValueError: ..."


@dataclass(frozen=True, slots=True)
class JobEnd:
    """A Ray Job's end (``ray job submit``): its status and message."""

    submission_id: str
    status: str  # SUCCEEDED, FAILED, STOPPED (PENDING and RUNNING: not ended)
    message: str = ""
    exit_code: int | None = None


@dataclass(frozen=True, slots=True)
class RayFacts:
    """What Ray knows of a process that stopped heartbeating (each part when Ray keeps it)."""

    death: ActorDeath | None = None  # the actor's death (None: a driver, or not dead)
    task: TaskFailure | None = None
    job: JobEnd | None = None
    driver_gone: bool = False  # a Reporter in a driver: the job's driver has exited


class EndingKind(StrEnum):
    FINISHED = "finished"
    FAILED = "failed"
    PREEMPTED = "preempted"


@dataclass(frozen=True, slots=True)
class RayEnding:
    """A rank's end as Ray told it: ``how`` in words (shown where the run's end is shown), and for
    a failure or a preemption the outcome its alert names."""

    kind: EndingKind
    how: str
    outcome: Outcome | None = None


_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')
_LAST_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:\([\w.]*\))?): ?(.*)$")
_MEMORY = re.compile(r"Memory on the node \(IP: ([^,]+),.*? was ([\d.]+\s*[KMGT]?B"
                     r" / [\d.]+\s*[KMGT]?B(?: \([\d.]+\))?)", re.DOTALL)
_OWNER_EXIT = re.compile(r"Owner worker exit type: ([A-Z_]+)")


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0].strip() if text.strip() else ""


def _exception(task: TaskFailure) -> Outcome:
    """The exception a failed task's traceback ends with: type, message and frames."""
    lines = [line for line in task.message.strip().splitlines() if line.strip()]
    exc_type, message = task.error_type or "TaskError", _first_line(task.message)
    for i in range(len(lines) - 1, -1, -1):  # the last "Type: message" line (not indented)
        match = _LAST_LINE.match(lines[i])
        if match and not lines[i].startswith(" "):
            exc_type = match.group(1)
            message = "\n".join([match.group(2), *lines[i + 1:]]).strip()
            break
    frames = tuple(f"{f}:{n} in {fn}" for f, n, fn in _FRAME.findall(task.message))
    return Outcome(OutcomeKind.EXCEPTION, exc_type, message, frames[-MAX_OUTCOME_FRAMES:])


def _job_exception(message: str) -> Outcome | None:
    """The exception a failed Ray Job's entrypoint died of: the last traceback in the logs Ray
    appends to the job's message ("... failed with exit code 1, last available logs ...")."""
    at = message.rfind("Traceback (most recent call last):")
    if at < 0:
        return None
    return _exception(TaskFailure("", "RayJobFailed", message[at:]))


def _memory(death: ActorDeath) -> str:
    """"on node 10.0.0.3, 7.3GB / 7.7GB (0.95) in use": what Ray's memory monitor says."""
    text = death.oom or death.message
    match = _MEMORY.search(text)
    if match:
        return f"on node {match.group(1)}, memory {match.group(2)} in use"
    return f"on node {death.node_ip}" if death.node_ip else ""


def _is_oom(death: ActorDeath) -> bool:
    text = (death.oom + " " + death.message).lower()
    return bool(death.oom) or "memory monitor" in text or "low on memory" in text or (
        "oom" in text and "killed by the oom killer" not in text)


def judge_ending(facts: RayFacts, name: str, reached_end: bool | None = None) -> RayEnding | None:
    """How the process of one rank ended, from what Ray knows of it; None where Ray's facts do
    not say (the caller keeps judging by silence). ``name`` is how the sentence names it
    (``"actor 1a2b..."``); ``reached_end`` whether the run reached its planned last step (None:
    it never said its total)."""
    job, task, death = facts.job, facts.task, facts.death
    if task is not None and task.error_type == "TASK_EXECUTION_EXCEPTION":
        outcome = _exception(task)
        return RayEnding(EndingKind.FAILED, f"Ray: {task.name or 'a task'} of {name} raised "
                                            f"{outcome.exc_type} (a failed task)", outcome)
    if job is not None and job.status in ("FAILED", "STOPPED"):
        # "... failed with exit code 1, last available logs (...):": the logs follow, not said
        message = _first_line(job.message).split(", last available logs")[0]
        how = f"Ray Job {job.submission_id} {job.status}" + (f": {message}" if message else "")
        if job.status == "STOPPED":
            return RayEnding(EndingKind.PREEMPTED, how, Outcome(
                OutcomeKind.SIGNAL, "RayJobStopped", message, signal="ray job stop"))
        raised = _job_exception(job.message)
        if raised is not None:  # the entrypoint's own exception, from the logs Ray kept
            return RayEnding(EndingKind.FAILED, how, replace(raised, exit_code=job.exit_code))
        return RayEnding(EndingKind.FAILED, how, Outcome(
            OutcomeKind.EXIT if job.exit_code else OutcomeKind.EXCEPTION, "RayJobFailed",
            message, exit_code=job.exit_code))
    if job is not None and job.status in ("PENDING", "RUNNING") and (
            death is None or death.reason == "OWNER_DIED"):
        return None  # its driver just ended: the job's status, written next, says how
    if death is None:
        if facts.driver_gone and job is not None and job.status == "SUCCEEDED":
            return RayEnding(EndingKind.FINISHED, f"Ray Job {job.submission_id} SUCCEEDED")
        return None
    node = f" on node {death.node_ip}" if death.node_ip else ""
    if death.reason == "WORKER_DIED":
        if _is_oom(death):
            where = _memory(death)
            return RayEnding(EndingKind.FAILED, f"Ray: {name} was killed for lack of memory"
                             f" {where}".rstrip(), Outcome(
                                 OutcomeKind.EXCEPTION, "OutOfMemory",
                                 f"Ray's memory monitor killed the worker {where}".strip()))
        # Ray's message, without its list of common causes (the alert's what-to-check has them)
        said = _first_line(death.message).split(" Some common causes include")[0]
        return RayEnding(EndingKind.FAILED, f"Ray: the worker process of {name} died{node}",
                         Outcome(OutcomeKind.EXCEPTION, "WorkerDied",
                                 said or "its worker process died"))
    if death.reason == "NODE_DIED":
        said = f"{death.node_death} {death.node_death_message} {death.message}".lower()
        its_node = f"node {death.node_ip}" if death.node_ip else "the node"
        if "preempt" in said:
            return RayEnding(EndingKind.PREEMPTED, f"Ray: {its_node} of {name} was preempted",
                             Outcome(OutcomeKind.SIGNAL, "NodePreempted",
                                     death.node_death_message or _first_line(death.message),
                                     signal="node preempted"))
        return RayEnding(EndingKind.FAILED, f"Ray: {its_node} of {name} died", Outcome(
            OutcomeKind.EXCEPTION, "NodeDied",
            death.node_death_message or _first_line(death.message) or "its node died"))
    if job is not None and job.status == "SUCCEEDED":
        return RayEnding(EndingKind.FINISHED, f"Ray Job {job.submission_id} SUCCEEDED; Ray "
                                              f"ended {name} with it")
    if death.reason == "OWNER_DIED":
        exit_type = _OWNER_EXIT.search(death.message)
        kind = exit_type.group(1) if exit_type else ""
        if kind in ("", "INTENDED_USER_EXIT", "INTENDED_SYSTEM_EXIT"):
            return RayEnding(EndingKind.FINISHED, f"its driver ended normally and Ray ended "
                                                  f"{name} with it (Ray: OWNER_DIED)")
        return RayEnding(EndingKind.FAILED, f"Ray: the driver (owner) of {name} died ({kind})",
                         Outcome(OutcomeKind.EXCEPTION, "OwnerDied", _first_line(death.message)))
    if death.reason == "RAY_KILL":
        if reached_end is False:  # killed mid-run (a lost rank, a teardown after a failure):
            return None  # its peers and the silence say more than the kill
        return RayEnding(EndingKind.FINISHED, f"its driver killed {name} with ray.kill "
                                              "(Ray: RAY_KILL)")
    if death.reason in ("OUT_OF_SCOPE", "REF_DELETED"):
        return RayEnding(EndingKind.FINISHED, f"Ray ended {name} when its handle went out of "
                                              f"scope (Ray: {death.reason})")
    return None
