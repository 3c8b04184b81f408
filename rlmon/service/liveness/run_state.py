"""The state of each (run, role) by time, not by steps: running, slow, stalled, frozen, dead,
failed, preempted, finished.

:class:`LivenessTracker` is told what the aggregator hears (step messages, heartbeats, finalized
steps, a clean close) with the unix time it heard it, and :meth:`LivenessTracker.evaluate` is
called on a timer: a run that produces no step still changes state, which is the point. Its
knowledge is plain data (:meth:`LivenessTracker.dump` / :meth:`LivenessTracker.load`) so a
restarted aggregator continues where it stopped instead of waiting to relearn who is dead.

- failed: a rank's closing heartbeat said its process ended by an exception, a non-zero exit or
  a fatal signal (or another role of the run failed), or Ray said its actor died of a failure
  (a method that raised, a crashed or out-of-memory worker, a lost node);
- preempted: ranks ended by a signal from outside (SIGTERM, SIGINT, SIGHUP), a preempted node or
  a stopped Ray Job, none failed;
- finished: every rank that spoke closed cleanly, or Ray ended its actors with a driver that
  ended normally (or that killed them with ``ray.kill``), or the run said ``finish_run``;
- dead: the stream heartbeats, every rank has been silent (no heartbeat, no step) for
  ``dead_after_seconds``, and its processes are gone, or the probe cannot tell;
- frozen: silent as dead, but a process of the run still exists (stopped, in a debugger, a
  call holding the GIL): :mod:`rlmon.service.liveness.process_probe`;
- stalled: ranks are alive but no step finalized for the stall threshold
  (:mod:`rlmon.service.liveness.thresholds`);
- slow: steps still finalize, but ``slow_steps`` intervals in a row were ``slow_factor`` times
  the run's own baseline;
- running: otherwise.

A stream that never sent a heartbeat (an older Reporter, a replayed file) is never called dead:
silence between its steps is all there is to see, and it is judged a stall.

A rank silent for two heartbeats has its process asked about (the probe): under Ray the probe
says how a dead actor ended (:mod:`rlmon.service.liveness.ray_ending`), and that end is taken at
once, without waiting for the dead limit. A run that said its planned number of steps
(``total_steps``) and reached it is ending: no stall until ``final_seconds`` after its last step.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from rlmon.service.contract.heartbeat import (
    Heartbeat,
    OpenSpan,
    Outcome,
    OutcomeKind,
    ProcessId,
)
from rlmon.service.contract.timeline import Timeline
from rlmon.service.liveness.process_probe import (
    ProcessFate,
    ProcessProbe,
    SameNodeProbe,
    Sighting,
    judge_sightings,
)
from rlmon.service.liveness.ray_ending import EndingKind, RayFacts, judge_ending
from rlmon.service.liveness.thresholds import (
    LivenessParams,
    StepPeriods,
    early_deadline,
    ending_deadline,
)
from rlmon.service.metrics.rank import Rank
from rlmon.service.wording import counted

__all__ = ["LivenessTracker", "LivenessView", "RankEnd", "RankSeen", "RunState", "StageGroup",
           "StuckStage", "describe_end", "describe_finish", "end_cause", "rank_label"]

Stream = tuple[str, str]
_MAX_STAGE_NAMES = 256  # span names whose usual duration a stream remembers
_USUAL_DECAY = 0.98  # per step: an old longest span fades over a few hundred steps
# Ray's task events reach the GCS about a second after the task ends: an overdue run's idle
# ranks are asked about at the threshold and twice more, a heartbeat period apart, then not
# again until a step (each ask reads every task event the GCS keeps, up to 100,000)
_TASK_ASKS = 3


class RunState(StrEnum):
    RUNNING = "running"
    SLOW = "slow"
    STALLED = "stalled"
    DEAD = "dead"
    FINISHED = "finished"
    FAILED = "failed"  # a rank ended by an exception, a non-zero exit or a fatal signal
    PREEMPTED = "preempted"  # ranks ended by a signal from outside (SIGTERM), none failed
    FROZEN = "frozen"  # every rank silent, but a process of the run still exists


# signals that stop a process from outside (a scheduler's preemption, Ctrl-C, a closed
# terminal): the run did not fail, it was stopped; SIGSEGV, SIGABRT, SIGBUS are failures
_STOP_SIGNALS = frozenset({"SIGTERM", "SIGINT", "SIGHUP"})


def is_stop(outcome: Outcome) -> bool:
    """Whether ``outcome`` is a stop from outside (preemption) rather than a failure."""
    if outcome.kind is OutcomeKind.SIGNAL:
        return outcome.signal in _STOP_SIGNALS
    return outcome.kind is OutcomeKind.EXCEPTION and outcome.exc_type.endswith(
        "KeyboardInterrupt")


def rank_label(rank: Rank) -> str:
    """``dp=3`` or ``dp=1 tp=2``: the axes that are not zero (``dp=0`` for the first rank)."""
    parts = [f"{axis}={v}" for axis, v in zip(("dp", "cp", "tp", "pp"), rank, strict=True) if v]
    return " ".join(parts) or "dp=0"


@dataclass(frozen=True, slots=True)
class StageGroup:
    """Ranks in the same stage (``""``: no open span; ``"(silent)"``: not heard lately)."""

    stage: str
    ranks: tuple[Rank, ...]
    since: float | None  # when the earliest of them entered it


@dataclass(frozen=True, slots=True)
class RankSeen:
    """Where a rank that fell silent or ended was last heard: its stage, its host (and Ray node),
    when, and the last step it ended (what ``RankMissing`` says of the ranks a step lacks)."""

    rank: Rank
    stage: str  # the spans of its last heartbeat ("": none open)
    host: str
    node: str  # Ray's node id ("": not under Ray)
    heard: float
    last_step: int | None


_MAX_SEEN = 64  # silent ranks a view names where they were last heard


@dataclass(frozen=True, slots=True)
class StuckStage:
    """One rank far past its usual duration in a stage while other ranks are elsewhere."""

    rank: Rank
    stage: str
    since: float
    usual: float | None  # the stage's usual duration (None: the step period stood in)
    limit: float


@dataclass(frozen=True, slots=True)
class RankEnd:
    """How a rank's process ended badly, with where it was and the last step it ended."""

    rank: Rank
    outcome: Outcome
    at: float  # when its closing heartbeat arrived (unix seconds)
    stage: str  # the spans open at the end, else the last ones heard ("": none)
    last_step: int | None
    # the closing heartbeat said the stage itself (the spans open where the exception was raised,
    # or at the signal), not only the last regular heartbeat before the end
    stage_at_end: bool = False
    source: str = ""  # how rlmon learned it, when not from the rank's own last word ("Ray: ...")
    stopped: bool = False  # a stop from outside that is not a signal (a preempted node, ...)

    @property
    def stop(self) -> bool:
        return self.stopped or is_stop(self.outcome)


@dataclass(frozen=True, slots=True)
class LivenessView:
    """What the service needs to alert and export one stream's liveness at time ``at``."""

    run: str
    role: str
    state: RunState
    since: float  # when the stream entered ``state``
    at: float
    last_step: int | None
    last_step_at: float | None  # unix time the last step finalized
    last_heard: float | None  # the latest heartbeat or step message of any rank
    period: float | None  # typical step period
    threshold: float  # stall threshold now
    ranks: int  # ranks of the world
    where: tuple[StageGroup, ...] = ()
    stuck: StuckStage | None = None
    gpus_per_rank: float = 1.0
    slow_ratio: float | None = None  # recent interval over the baseline period
    heartbeats: bool = False  # the stream heartbeats (else it cannot be called dead)
    ends: tuple[RankEnd, ...] = ()  # failed or preempted ranks of this (run, role)
    failed_roles: tuple[str, ...] = ()  # the run's other roles with failed ranks
    processes: ProcessFate | None = None  # a silent run: do its processes still exist?
    sightings: tuple[str, ...] = ()  # what the probe saw, per process
    overdue: bool = False  # no finalized step for the stall threshold (whatever the state)
    first_heard: float | None = None
    ended_how: str = ""  # a finished run: how it ended ("its driver ended normally ...")
    total_steps: int | None = None  # the steps the run planned, when it said
    last_seen: tuple[RankSeen, ...] = ()  # ranks silent for two heartbeats, or ended
    rerun: bool = False  # ranks that had ended spoke again (a new attempt) since it last ended

    @property
    def idle_seconds(self) -> float:
        """Seconds since the last step (or since the stream was first heard)."""
        ref = self.last_step_at if self.last_step_at is not None else self.since
        return max(0.0, self.at - ref)

    @property
    def odd(self) -> tuple[Rank, ...]:
        """Ranks in a different stage from most ranks (the ones to look at first)."""
        heard = [g for g in self.where if g.stage not in (SILENT, SILENT_ALIVE)]
        if len(heard) < 2:
            return ()
        biggest = max(len(g.ranks) for g in heard)
        majority = [g for g in heard if len(g.ranks) == biggest]
        if len(majority) > 1:  # a tie: the stage entered first is where the hang began
            majority = [max(majority, key=lambda g: g.since or 0.0)]
        return tuple(r for g in heard if g is not majority[0] for r in g.ranks)

    @property
    def ended_at(self) -> float | None:
        """When the first of its ranks ended badly."""
        return min((e.at for e in self.ends), default=None)

    def key(self) -> tuple[Any, ...]:
        """What a change of makes the view worth publishing at once."""
        stuck = (self.stuck.rank, self.stuck.stage) if self.stuck is not None else None
        return self.state, stuck, self.overdue, len(self.ends)

    @property
    def reached_end(self) -> bool | None:
        """Whether the run's last finalized step is its planned last (None: no total said).
        Steps count from 0 or from 1 by framework: the last of ``total_steps`` is
        ``total_steps - 1`` or ``total_steps``, either reaches it."""
        if self.total_steps is None:
            return None
        return self.last_step is not None and self.last_step + 1 >= self.total_steps


SILENT = "(silent)"
SILENT_ALIVE = "(silent, process alive)"


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 10:  # a 0.4 s step period is not "0s"
        return f"{seconds:.1f}s"
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"


def _ranks(ranks: tuple[Rank, ...], limit: int = 6) -> str:
    shown = ", ".join(rank_label(r) for r in ranks[:limit])
    more = len(ranks) - limit
    return shown + (f" and {more} more" if more > 0 else "")


def _outcome_text(outcome: Outcome) -> str:
    if outcome.kind is OutcomeKind.SIGNAL:
        return f"killed by {outcome.signal or 'a signal'}"
    if outcome.kind is OutcomeKind.EXIT:
        return f"exited with code {outcome.exit_code}"
    message = outcome.message.strip().splitlines()[0] if outcome.message.strip() else ""
    text = f"{outcome.exc_type or 'an exception'}" + (f": {message}" if message else "")
    if outcome.frames:
        text += f" (at {outcome.frames[-1]})"
    return text


def describe_end(view: LivenessView) -> str:
    """A failed or preempted run: which ranks ended how, in which stage, after which step, and
    what the run had cost until then (GPU-hours from first heard to the first end)."""
    groups: dict[tuple[str, str, bool], list[RankEnd]] = {}
    for end in view.ends:
        key = (_outcome_text(end.outcome), end.stage, end.stage_at_end and bool(end.stage))
        groups.setdefault(key, []).append(end)
    parts = []
    for (what, stage, at_end), ends in groups.items():
        ranks = tuple(e.rank for e in ends)
        steps = sorted({e.last_step for e in ends if e.last_step is not None})
        last = (f"last step {steps[-1]}" if len(steps) == 1 else
                f"last steps {steps[0]}-{steps[-1]}" if steps else "no step ended")
        # the closing heartbeat names the spans open where it ended; without them, the stage of
        # the rank's last heartbeat before its end ("last seen in")
        where = (f"in {stage}" if at_end else f"last seen in {stage}" if stage
                 else "outside any span")
        sources = sorted({e.source for e in ends if e.source})
        told = f" ({'; '.join(sources)})" if sources else ""
        parts.append(f"{_ranks(ranks)}: {what}{told}; {where}, {last}")
    text = "; ".join(parts)
    if not view.ends and view.failed_roles:
        text = f"the run's role {', '.join(view.failed_roles)} failed"
    ended = view.ended_at
    if ended is not None and view.first_heard is not None:
        gpus = view.ranks * view.gpus_per_rank
        hours = max(0.0, ended - view.first_heard) / 3600 * gpus
        text += (f". The run had run {_duration(ended - view.first_heard)} on {gpus:g} GPUs "
                 f"({hours:.3g} GPU-hours) when it ended")
    last = f"step {view.last_step}" if view.last_step is not None else "no step"
    return text + f". Last finalized: {last}"


def describe_finish(view: LivenessView) -> str:
    """A finished run: its last step, whether that was the last it planned (steps count from 0
    or 1 by framework: "step 29 of 30" read as a step short of a plan it completed), and how
    it ended."""
    last = f"step {view.last_step}" if view.last_step is not None else "no step"
    of = "" if view.total_steps is None else (
        f", the last of {view.total_steps} planned steps" if view.reached_end
        else f", short of the {view.total_steps} planned steps")
    how = view.ended_how or "its Reporters closed cleanly"
    return f"Finished at {last}{of}: {how}"


_RAY_SAID = re.compile(r"\(Ray: ([A-Z_]+)\)")


def end_cause(view: LivenessView) -> tuple[str, str]:
    """How an ended (run, role) ended, as a short token and the stage it ended in (the labels of
    ``rlmon_run_end_info``): ``clean`` (its Reporters closed, or ``finish_run``), Ray's word
    for a run Ray ended (``owner_died``, ``ray_kill``, ``out_of_scope``, ``ray_job_succeeded``),
    else the first end's exception type, ``exit_N`` or signal; ("", "") while it runs."""
    if view.state is RunState.FINISHED:
        said = _RAY_SAID.search(view.ended_how)
        if said:
            return said.group(1).lower(), ""
        if "Ray Job" in view.ended_how and "SUCCEEDED" in view.ended_how:
            return "ray_job_succeeded", ""
        return ("clean" if not view.ended_how else "ended"), ""
    if view.state not in (RunState.FAILED, RunState.PREEMPTED):
        return "", ""
    if not view.ends:
        return ("role_failed", "") if view.failed_roles else ("unknown", "")
    first = min(view.ends, key=lambda e: (e.at, e.rank))
    outcome = first.outcome
    if outcome.kind is OutcomeKind.EXIT:
        cause = f"exit_{outcome.exit_code}" if outcome.exit_code is not None else "exit"
    elif outcome.kind is OutcomeKind.SIGNAL:
        cause = outcome.signal or outcome.exc_type or "signal"
    else:
        cause = outcome.exc_type or "exception"
    return cause, first.stage


def _processes_text(view: LivenessView) -> str:
    if view.processes is None:
        return ""
    seen = "; ".join(view.sightings[:4]) + (
        f" and {len(view.sightings) - 4} more" if len(view.sightings) > 4 else "")
    head = {ProcessFate.ALIVE: "Processes still exist, silent",
            ProcessFate.GONE: "Processes gone",
            ProcessFate.UNKNOWN: "Whether the processes still exist is unknown"}[view.processes]
    return f". {head}" + (f" ({seen})" if seen else "")


def describe(view: LivenessView) -> str:
    """Where each rank is, who is odd, how long since the last step: the text of a liveness
    alert (its cost is the alert's, :mod:`rlmon.service.goodput.alert_costs`)."""
    if view.state in (RunState.FAILED, RunState.PREEMPTED):
        return describe_end(view)
    if view.state is RunState.FINISHED:
        return describe_finish(view)
    parts = []
    for group in view.where:
        stage = ("no heartbeat" if group.stage == SILENT
                 else "no heartbeat, process alive" if group.stage == SILENT_ALIVE
                 else group.stage or "no open span")
        how_long = f" for {_duration(view.at - group.since)}" if group.since is not None else ""
        parts.append(f"{stage}{how_long}: {counted(len(group.ranks), 'rank')} "
                     f"({_ranks(group.ranks)})")
    text = "; ".join(parts)
    if view.odd:
        text += f". In a different stage from the rest: {_ranks(view.odd)}"
    if view.stuck is not None:
        s = view.stuck
        usual = f"usually {_duration(s.usual)}" if s.usual is not None else "no usual duration"
        text += (f". Stuck: {rank_label(s.rank)} in {s.stage} for "
                 f"{_duration(view.at - s.since)} ({usual}; limit {_duration(s.limit)})")
    if view.last_step is not None:
        last = f"step {view.last_step}, {_duration(view.idle_seconds)} ago"
    else:  # the silence runs from the run's first word, not from this state's start
        heard = view.first_heard if view.first_heard is not None else view.since
        last = f"no step yet, {_duration(max(0.0, view.at - heard))} since first heard"
    text += f". Last step: {last}; stall threshold {_duration(view.threshold)}"
    if view.period is not None:
        text += f" (typical step {_duration(view.period)})"
    return text + _processes_text(view)


@dataclass(slots=True)
class _Rank:
    heard: float
    spans: tuple[OpenSpan, ...] = ()
    closed: bool = False
    stage: tuple[OpenSpan, ...] = ()  # the last open spans heard (where a failed rank was)
    last_step: int | None = None
    process: ProcessId | None = None
    process_since: float = 0.0  # when this process was first heard
    end: RankEnd | None = None  # how the rank ended badly (None: running or clean)
    closed_sent: float = 0.0  # the closing heartbeat's send time (older beats are not a rerun)
    raised: Outcome | None = None  # a method of its actor raised (wrapper, Ray), no step since
    raised_at: float = 0.0  # when that was first heard (not saved: every heartbeat says it again)
    raised_how: str = ""  # Ray's failed task that said it (no wrapper); "": the wrapper said it
    pending: RankEnd | None = None  # an actor's SIGTERM, until Ray says why (not saved)
    said_heard: float = 0.0  # when its last heartbeat (its account of ``spans``) arrived

    def spans_at(self, now: float, grace: float) -> tuple[OpenSpan, ...]:
        """Its open spans as its account puts them at ``now``: the time in a span is what its
        last heartbeat said and the time since that heartbeat arrived, at most ``grace``
        (``spans`` are on this clock already, see :meth:`LivenessTracker.heartbeat`). An
        account not renewed (a wedged process, a sender held up) never counts as time spent in
        the stage: silence has its own limits (the probe, the dead limit)."""
        late = now - self.said_heard - grace
        if late <= 0 or not self.spans:
            return self.spans
        return tuple(OpenSpan(s.name, s.since + late) for s in self.spans)

    def to_json(self, rank: Rank) -> list[Any]:
        proc = self.process
        end = self.end
        if proc is None and end is None and not self.closed_sent:
            return [list(rank), self.heard, self.closed]  # all a restart needs of most ranks
        return [list(rank), self.heard, self.closed, {
            "stage": "/".join(s.name for s in self.stage), "last_step": self.last_step,
            "closed_sent": self.closed_sent,
            "process": None if proc is None else [proc.hostname, proc.pid, proc.node_id,
                                                  proc.job_id, proc.worker_id, proc.actor_id],
            "process_since": self.process_since,
            "end": None if end is None else {
                "kind": end.outcome.kind.value, "exc_type": end.outcome.exc_type,
                "message": end.outcome.message, "frames": list(end.outcome.frames),
                "exit_code": end.outcome.exit_code, "signal": end.outcome.signal,
                "at": end.at, "stage": end.stage, "last_step": end.last_step,
                "stage_at_end": end.stage_at_end, "source": end.source,
                "stopped": end.stopped}}]

    @classmethod
    def from_json(cls, item: list[Any]) -> tuple[Rank, _Rank]:
        rank = Rank(*map(int, item[0]))
        seen = cls(float(item[1]), (), bool(item[2]))
        extra = item[3] if len(item) > 3 and isinstance(item[3], dict) else {}
        seen.stage = tuple(OpenSpan(str(n), 0.0) for n in str(extra.get("stage", "")).split("/")
                           if n)
        seen.last_step = extra.get("last_step")
        seen.closed_sent = float(extra.get("closed_sent", 0.0))
        proc = extra.get("process")
        if proc:
            seen.process = ProcessId(str(proc[0]), int(proc[1]), *map(str, proc[2:6]))
        seen.process_since = float(extra.get("process_since", 0.0))
        end = extra.get("end")
        if end:
            outcome = Outcome(OutcomeKind(end["kind"]), str(end["exc_type"]),
                              str(end["message"]), tuple(map(str, end["frames"])),
                              end["exit_code"], str(end["signal"]))
            seen.end = RankEnd(rank, outcome, float(end["at"]), str(end["stage"]),
                               end["last_step"], bool(end.get("stage_at_end", False)),
                               str(end.get("source", "")), bool(end.get("stopped", False)))
        return rank, seen


@dataclass(slots=True)
class _Stream:
    run: str
    role: str
    first_heard: float
    world_size: int = 1
    ranks: dict[Rank, _Rank] = field(default_factory=dict)
    heartbeats: bool = False
    last_step: int | None = None
    last_step_at: float | None = None  # when the last step finalized (this clock): silence
    last_step_time: float | None = None  # when it happened (its ranks' clock): the pace
    steps: int = 0
    periods: StepPeriods = field(default_factory=StepPeriods)
    usual: dict[str, float] = field(default_factory=dict)
    state: RunState = RunState.RUNNING
    since: float = 0.0
    finished: bool = False
    gpus_per_rank: float | None = None
    stuck: StuckStage | None = None
    published: tuple[Any, ...] | None = None
    step0_seconds: float | None = None  # step 0's duration (its timelines), for the first steps
    processes: ProcessFate | None = None  # the probe's verdict while every rank is silent
    sightings: tuple[str, ...] = ()
    probe_due: float = 0.0
    overdue: bool = False
    total_steps: int | None = None  # the steps the run plans (its Reporters said)
    ended_how: str = ""  # how a finished run ended (Ray's account, or its Reporters')
    ray_due: float = 0.0  # when silent ranks' processes are next asked how they ended
    ray_quiet: frozenset[Rank] = frozenset()  # ... and which were silent when last asked
    tasks_due: float = 0.0  # when idle ranks' last tasks are next asked about (overdue)
    tasks_asked: int = 0  # ... and how often since the last step (a read of every task event)
    rerun: bool = False  # ranks that had ended spoke again since the stream last ended

    def to_json(self) -> dict[str, Any]:
        return {
            "first_heard": self.first_heard, "world_size": self.world_size,
            "ranks": [s.to_json(r) for r, s in self.ranks.items()],
            "step0_seconds": self.step0_seconds,
            "heartbeats": self.heartbeats, "last_step": self.last_step,
            "last_step_at": self.last_step_at, "last_step_time": self.last_step_time,
            "steps": self.steps,
            "periods": self.periods.to_json(), "usual": self.usual, "state": self.state.value,
            "since": self.since, "finished": self.finished, "gpus_per_rank": self.gpus_per_rank,
            "total_steps": self.total_steps, "ended_how": self.ended_how,
        }

    @classmethod
    def from_json(cls, run: str, role: str, obj: dict[str, Any]) -> _Stream:
        stream = cls(run, role, float(obj["first_heard"]), int(obj.get("world_size", 1)))
        stream.ranks = dict(_Rank.from_json(item) for item in obj.get("ranks", ()))
        step0 = obj.get("step0_seconds")
        stream.step0_seconds = float(step0) if step0 is not None else None
        stream.heartbeats = bool(obj.get("heartbeats"))
        stream.last_step = obj.get("last_step")
        stream.last_step_at = obj.get("last_step_at")
        stream.last_step_time = obj.get("last_step_time")
        stream.steps = int(obj.get("steps", 0))
        stream.periods = StepPeriods.from_json(obj.get("periods", {}))
        stream.usual = {str(k): float(v) for k, v in obj.get("usual", {}).items()}
        stream.state = RunState(obj.get("state", "running"))
        stream.since = float(obj.get("since", stream.first_heard))
        stream.finished = bool(obj.get("finished"))
        gpus = obj.get("gpus_per_rank")
        stream.gpus_per_rank = float(gpus) if gpus is not None else None
        total = obj.get("total_steps")
        stream.total_steps = int(total) if total is not None else None
        stream.ended_how = str(obj.get("ended_how", ""))
        stream.published = (stream.state, None, stream.state is RunState.STALLED, sum(
            1 for r in stream.ranks.values() if r.end is not None))  # said before the restart
        return stream


def _raised_how(r: _Rank) -> str:
    return r.raised_how or "a method of its actor raised (rlmon's method wrapper)"


def _ends(stream: _Stream) -> list[RankEnd]:
    """The ranks of ``stream`` that ended badly; and, once no step has finalized for the stall
    threshold (in a run that did not say it finished), those whose actor's method raised with no
    step since (rlmon's method wrapper said it, or Ray's task events): the exception is why the
    run stopped, said before Ray's account of the actor (late on a loaded machine) arrives."""
    out = []
    for rank, r in stream.ranks.items():
        if r.end is not None:
            out.append(r.end)
        elif stream.overdue and r.raised is not None and not r.closed and not stream.finished:
            stage = "/".join(s.name for s in r.stage)
            out.append(RankEnd(rank, r.raised, r.raised_at, stage, r.last_step, bool(stage),
                               f"{_raised_how(r)} and no step followed"))
    return out


class LivenessTracker:
    """Per (run, role) liveness on the caller's unix clock (``now`` is passed in)."""

    def __init__(self, params: LivenessParams | None = None,
                 probe: ProcessProbe | None = None) -> None:
        self.params = params or LivenessParams()
        # asked before a silent run is called dead (the Ray actors set Ray's own)
        self.probe: ProcessProbe = probe if probe is not None else SameNodeProbe()
        self._streams: dict[Stream, _Stream] = {}
        self._totals: dict[str, int] = {}  # run -> its planned steps, said by any of its roles

    def __len__(self) -> int:
        return len(self._streams)

    def __contains__(self, stream: object) -> bool:
        return stream in self._streams

    def _stream(self, run: str, role: str, now: float) -> _Stream:
        stream = self._streams.get((run, role))
        if stream is None:
            stream = self._streams[(run, role)] = _Stream(run, role, now, since=now)
        return stream

    # --- what the aggregator hears -------------------------------------------------------------

    def heard(self, run: str, role: str, rank: Rank, world_size: int, now: float) -> None:
        """A step message of ``rank``: the rank is alive (and not closed)."""
        stream = self._stream(run, role, now)
        stream.world_size = world_size
        seen = stream.ranks.get(rank)
        if seen is None:
            stream.ranks[rank] = _Rank(now)
        else:
            seen.heard, seen.closed = max(seen.heard, now), False

    def heartbeat(self, beat: Heartbeat, now: float) -> None:
        """A (checked) heartbeat arrived at ``now``."""
        stream = self._stream(beat.run, beat.role, now)
        stream.world_size = beat.world.size
        stream.heartbeats = True
        stream.gpus_per_rank = beat.gpus_per_rank
        if beat.total_steps is not None:
            stream.total_steps = beat.total_steps
            self._totals[beat.run] = beat.total_steps  # the run's other roles share it
        outcome = beat.outcome if beat.outcome is not None and beat.outcome.failed else None
        offset = now - beat.sent if beat.sent > 0 else 0.0  # 0: a producer's unset
        rerun = False
        for item in beat.ranks:
            seen = stream.ranks.get(item.rank)
            if seen is None:
                seen = stream.ranks[item.rank] = _Rank(now)
            # a rank that ended speaks again, later than its end: a rerun (a new attempt)
            rerun |= not beat.closing and seen.end is not None and beat.sent > seen.closed_sent
            seen.heard = max(seen.heard, now)
            # the spans' starts on this clock, from the rank's account: how long it had been in
            # each when it sent the heartbeat (its own clock), before the heartbeat's arrival
            # here; a heartbeat carried late, or a rank clock ahead or behind, is not time there
            seen.spans = item.spans if offset == 0 else tuple(
                OpenSpan(s.name, s.since + offset) for s in item.spans)
            seen.said_heard = now
            if item.spans:
                seen.stage = item.spans
            if item.last_step is not None:
                seen.last_step = item.last_step
            if beat.process is not None and beat.process != seen.process:
                seen.process, seen.process_since = beat.process, now
            if beat.raised is not None and beat.raised != seen.raised:
                seen.raised_at, seen.raised_how = now, ""
            if beat.raised is not None or not seen.raised_how:  # Ray's word holds to a step
                seen.raised = beat.raised
            seen.closed = beat.closing
            seen.pending = None
            if beat.closing:
                seen.closed_sent = beat.sent
                seen.end = None if outcome is None else RankEnd(
                    item.rank, outcome, now, "/".join(s.name for s in seen.stage),
                    seen.last_step, bool(item.spans))
                if seen.end is not None and seen.end.stop and seen.process is not None \
                        and seen.process.actor_id:
                    # Ray SIGTERMs an actor whose driver ended, well or not: Ray's account of
                    # the actor decides (_ask_ray); the signal stands if Ray says nothing
                    seen.pending, seen.end, seen.closed = seen.end, None, False
        if rerun:
            stream.rerun = True
            for other in stream.ranks.values():
                other.end = None
        if not beat.closing and stream.finished and stream.state is RunState.FINISHED:
            stream.finished = False  # heartbeats again after the end: a rerun
        if not beat.closing and rerun:
            stream.ended_how = ""

    def finalized(self, run: str, role: str, step: int, now: float,
                  happened: float | None = None) -> None:
        """A step of (run, role) finalized at ``now``: progress. ``happened`` is when its ranks
        ended it (their clock, the record's ``time``): the pace is measured between those, not
        between arrivals, which a loaded machine or a batched delivery bunches and spreads."""
        stream = self._stream(run, role, now)
        if stream.last_step is not None and step <= stream.last_step:
            return
        at = happened if happened is not None and happened > 0 else now  # 0: a producer's unset
        if stream.last_step_time is not None:
            slow = stream.state is RunState.SLOW
            stream.periods.add(at - stream.last_step_time, self.params, slow)
        stream.last_step, stream.last_step_at, stream.last_step_time = step, now, at
        stream.steps += 1
        stream.tasks_asked = 0
        for r in stream.ranks.values():
            if r.raised_how:  # a step followed the failed task Ray told of: the run went on
                r.raised, r.raised_how = None, ""
        if stream.finished and stream.state is RunState.FINISHED and not all(
                r.closed for r in stream.ranks.values()):
            stream.finished = False  # steps after finish_run: the run goes on

    def spans(self, run: str, role: str, timeline: Timeline, now: float,
              step: int | None = None) -> None:
        """Learn the usual duration of each stage from a rank's step timeline (and, from the
        first step's, how long the first step took: it bounds the next ones)."""
        stream = self._stream(run, role, now)
        first = step == 0 if step is not None else not stream.periods.recent
        if first:
            stream.step0_seconds = max(stream.step0_seconds or 0.0, timeline.seconds)
        longest: dict[str, float] = {}
        for span in timeline.spans:
            seconds = span.seconds
            if seconds > longest.get(span.name, 0.0):
                longest[span.name] = seconds
        usual = stream.usual
        for name in list(usual):
            usual[name] *= _USUAL_DECAY
        for name, seconds in longest.items():
            if name in usual or len(usual) < _MAX_STAGE_NAMES:
                usual[name] = max(usual.get(name, 0.0), seconds)

    def finish(self, run: str, now: float) -> None:
        """The run said it finished (``finish_run``)."""
        for (r, _role), stream in self._streams.items():
            if r == run:
                stream.finished = True

    def forget(self, run: str, role: str) -> None:
        self._streams.pop((run, role), None)
        if not any(r == run for r, _ in self._streams):
            self._totals.pop(run, None)

    # --- the timer -------------------------------------------------------------------------------

    def _failed_roles(self) -> dict[str, list[str]]:
        """Run -> its roles with a rank that ended badly (the whole run failed with them)."""
        out: dict[str, list[str]] = {}
        for (run, role), stream in self._streams.items():
            if _ends(stream):
                out.setdefault(run, []).append(role)
        return out

    def evaluate(self, now: float) -> list[LivenessView]:
        """Re-evaluate every stream at ``now``; returns the views whose state (or stuck stage)
        changed since they were last returned."""
        changed = []
        failed = self._failed_roles()
        for stream in self._streams.values():
            view = self._judge(stream, now, failed.get(stream.run, ()))
            if view.key() != stream.published:
                stream.published = view.key()
                changed.append(view)
        return changed

    def views(self, now: float) -> list[LivenessView]:
        """Every stream's view at ``now`` (no state change is recorded)."""
        failed = self._failed_roles()
        return [self._view(s, now, failed.get(s.run, ())) for s in self._streams.values()]

    def view(self, run: str, role: str, now: float) -> LivenessView | None:
        stream = self._streams.get((run, role))
        if stream is None:
            return None
        return self._view(stream, now, self._failed_roles().get(run, ()))

    def _threshold(self, stream: _Stream, now: float) -> float:
        """Seconds after the last progress (the last step, else first heard) that a stream
        without a finalized step is stalled: from two steps on the run's period decides, before
        that what it said so far (:func:`~rlmon.service.liveness.thresholds.early_deadline`)."""
        p = self.params
        progress = stream.last_step_at if stream.last_step_at is not None else stream.first_heard
        grace = p.ask_ray_after
        live = [r.spans_at(now, grace) for r in stream.ranks.values()
                if not r.closed and now - r.heard < p.dead_after_seconds]
        if stream.steps >= 2:
            if stream.periods.recent:
                threshold = stream.periods.stall_threshold(p, stream.steps, stream.step0_seconds)
            else:
                # the steps so far finalized together (one batch at a slow first connection): no
                # period measured, but the run is past its start, so no span allowance either
                threshold = max(p.stall_factor * (stream.step0_seconds or 0.0),
                                p.stall_floor_seconds)
        else:
            step0 = stream.step0_seconds if stream.steps >= 1 else None
            threshold = early_deadline(p, progress, step0, live, stream.usual) - progress
        # a save, an evaluation or an upload in progress, or a run past its planned last step:
        # their own allowance (a hang there still pages, later)
        ending = ending_deadline(p, progress, self._reached_end(stream) is True, live)
        return threshold if ending is None else max(threshold, ending - progress)

    def _reached_end(self, stream: _Stream) -> bool | None:
        """Whether the stream finalized its run's planned last step (None: no total said by
        any role of the run: the driver's integration often says it for the workers)."""
        total = stream.total_steps or self._totals.get(stream.run)
        if total is None:
            return None
        return stream.last_step is not None and stream.last_step + 1 >= total

    def _ask_ray(self, stream: _Stream, now: float) -> None:
        """Ranks silent for two heartbeats: ask the probe how their processes ended, and take
        an end it can tell (Ray's account of a dead actor) at once. Asked again every heartbeat
        period while they stay silent; a probe that fails leaves them to the dead limit."""
        p = self.params
        for r in stream.ranks.values():  # Ray said nothing of a signalled actor: the signal
            if r.pending is not None and now - r.heard >= p.dead_after_seconds:
                r.end, r.pending, r.closed = r.pending, None, True
        quiet = [(rank, r) for rank, r in stream.ranks.items()
                 if not r.closed and r.process is not None and now - r.heard >= p.ask_ray_after]
        asking = frozenset(rank for rank, _ in quiet)
        if not quiet or (now < stream.ray_due and asking <= stream.ray_quiet):
            return  # asked lately, and no rank fell silent since
        stream.ray_due, stream.ray_quiet = now + p.heartbeat_seconds, asking
        named = {r.process: r.process_since for _, r in quiet if r.process is not None}
        try:
            seen = self.probe.check(list(named), named)
        except Exception:  # a probe's failure must not stop the timer; the dead limit says it
            return
        reached = self._reached_end(stream)
        hows: list[str] = []
        for rank, r in quiet:
            sighting = seen.get(r.process) if r.process is not None else None
            if sighting is None or sighting.facts is None:
                continue
            ending = judge_ending(sighting.facts, "its actor", reached)
            if ending is None:
                continue
            r.closed, r.closed_sent, r.pending = True, now, None
            stage = "/".join(s.name for s in r.stage)
            if ending.kind is EndingKind.FINISHED and r.raised is None:
                hows.append(ending.how)
                continue
            if ending.kind is EndingKind.FINISHED:  # its driver ended the run after it raised
                r.end = RankEnd(rank, r.raised, now, stage, r.last_step, bool(stage),  # type: ignore[arg-type]
                                f"{_raised_how(r)}; then {ending.how}")
                continue
            # its own last step, else the run's last finalized one (every rank ended that)
            last = r.last_step if r.last_step is not None else stream.last_step
            r.end = RankEnd(rank, ending.outcome or r.raised or Outcome(OutcomeKind.EXCEPTION),
                            now, stage, last, False, ending.how,
                            ending.kind is EndingKind.PREEMPTED)
        if hows:
            stream.ended_how = "; ".join(dict.fromkeys(hows))

    def _ask_ray_tasks(self, stream: _Stream, now: float) -> None:
        """An overdue stream's live ranks that are idle in Ray actors (no open span: nothing
        calls them): did their actor's last method raise? rlmon's method wrapper says so at
        once; without it Ray's task events are all there is until the driver ends and Ray tears
        the actor down, which a loaded machine can make later than the stall threshold. Asked
        at the threshold and twice more a heartbeat period apart (``_TASK_ASKS``); what Ray
        says makes the run failed as the wrapper's word does (:func:`_ends`)."""
        ask = getattr(self.probe, "failed_tasks", None)
        if ask is None or now < stream.tasks_due or stream.tasks_asked >= _TASK_ASKS \
                or _ends(stream):
            return  # (a rank's end already says why the run stopped)
        idle = {r.process.actor_id: r for r in stream.ranks.values()
                if not r.closed and r.raised is None and not r.spans and r.process is not None
                and r.process.actor_id}
        if not idle:
            return
        stream.tasks_due = now + self.params.heartbeat_seconds
        stream.tasks_asked += 1
        try:
            failed = ask(list(idle))
        except Exception:  # a probe's failure must not stop the timer; the stall says it
            return
        for actor, r in idle.items():
            task = failed.get(actor)
            ending = judge_ending(RayFacts(task=task), "its actor") if task else None
            if ending is not None and ending.outcome is not None:
                r.raised, r.raised_at, r.raised_how = ending.outcome, now, ending.how

    def _processes(self, stream: _Stream, now: float) -> ProcessFate:
        """Whether the processes of a silent stream still exist (asked again every heartbeat
        period while it stays silent; a probe that fails says unknown)."""
        if stream.processes is not None and now < stream.probe_due:
            return stream.processes
        ranks = [r for r in stream.ranks.values() if not r.closed]
        named = {r.process: r.process_since for r in ranks if r.process is not None}
        sightings: list[Sighting] = []
        if named:
            try:
                seen = self.probe.check(list(named), named)
                sightings = [seen.get(proc) or Sighting(ProcessFate.UNKNOWN, "not answered")
                             for proc in named]
            except Exception as exc:  # a probe's failure must not stop the timer
                sightings = [Sighting(ProcessFate.UNKNOWN, f"the process probe failed: {exc}")]
        unnamed = sum(1 for r in ranks if r.process is None)
        if unnamed:
            sightings.append(Sighting(ProcessFate.UNKNOWN, f"{counted(unnamed, 'rank')} never "
                                      "named their process (an older Reporter)"))
        stream.processes = judge_sightings(sightings)
        stream.sightings = tuple(s.how for s in sightings)
        stream.probe_due = now + self.params.heartbeat_seconds
        return stream.processes

    def _judge(self, stream: _Stream, now: float, failed_roles: Any = ()) -> LivenessView:
        p = self.params
        self._ask_ray(stream, now)
        alive = [r for r in stream.ranks.values()
                 if not r.closed and now - r.heard < p.dead_after_seconds]
        open_ranks = [r for r in stream.ranks.values() if not r.closed]
        progress = stream.last_step_at if stream.last_step_at is not None else stream.first_heard
        threshold = self._threshold(stream, now)
        stream.overdue = now - progress > threshold
        if stream.overdue and not stream.finished:
            self._ask_ray_tasks(stream, now)
        ends = _ends(stream)
        if alive:
            stream.processes, stream.sightings, stream.probe_due = None, (), 0.0
        if ends or (failed_roles and not stream.finished and open_ranks):
            # the run's ends, every role's: a rank that raised makes the run failed, even where
            # this role's own ranks were then stopped by a signal (a launcher, Ray's teardown)
            everyone = [end for (run, _role), other in self._streams.items()
                        if run == stream.run for end in _ends(other)]
            state = (RunState.PREEMPTED if everyone and all(e.stop for e in everyone)
                     else RunState.FAILED)
        elif stream.finished or (stream.ranks and not open_ranks):
            state = RunState.FINISHED
        elif stream.heartbeats and not alive:
            fate = self._processes(stream, now)
            state = RunState.FROZEN if fate is ProcessFate.ALIVE else RunState.DEAD
        elif stream.overdue:
            state = RunState.STALLED
        elif stream.periods.is_slow(p) or (stream.state is RunState.SLOW
                                           and not stream.periods.recovered(p)):
            state = RunState.SLOW
        else:
            state = RunState.RUNNING
        if state is not stream.state:
            stream.state, stream.since = state, now
        if state in (RunState.FAILED, RunState.PREEMPTED):
            stream.rerun = False  # what ends it next: a rerun, or its own progress
        stream.stuck = self._stuck(stream, now) if state in (
            RunState.RUNNING, RunState.SLOW, RunState.STALLED) else None
        return self._view(stream, now, failed_roles)

    def _stuck(self, stream: _Stream, now: float) -> StuckStage | None:
        """The rank furthest past its stage's limit, when it is in a stage other ranks are not
        in (they wait for it); a hang of every rank in one stage is a stall, not this."""
        p = self.params
        alive = [(rank, r) for rank, r in stream.ranks.items()
                 if not r.closed and now - r.heard < p.dead_after_seconds]
        if len(alive) < 2:
            return None
        stages = Counter(r.spans[-1].name if r.spans else "" for _, r in alive)
        if len(stages) < 2:
            return None
        period = stream.periods.typical()
        worst: tuple[float, StuckStage] | None = None
        grace = p.ask_ray_after
        for rank, r in alive:
            if not r.spans or stages[r.spans[-1].name] * 2 > len(alive):
                continue  # most ranks are here: they are the ones waiting
            span = r.spans_at(now, grace)[-1]
            usual = stream.usual.get(span.name)
            base = usual if usual is not None else period
            if base is None:
                continue  # nothing yet to say what usual is
            limit = max(p.stuck_factor * base, p.stuck_floor_seconds)
            over = (now - span.since) / limit
            if over > 1 and (worst is None or over > worst[0]):
                worst = (over, StuckStage(rank, span.name, span.since, usual, limit))
        return worst[1] if worst is not None else None

    def _view(self, stream: _Stream, now: float, failed_roles: Any = ()) -> LivenessView:
        p = self.params
        grace = p.ask_ray_after
        groups: dict[str, list[tuple[Rank, float | None]]] = {}
        for rank, r in sorted(stream.ranks.items()):
            if r.closed:
                continue
            if stream.state is RunState.FROZEN and now - r.heard >= p.dead_after_seconds:
                groups.setdefault(SILENT_ALIVE, []).append((rank, r.heard))
            elif now - r.heard >= p.dead_after_seconds:
                groups.setdefault(SILENT, []).append((rank, r.heard))
            elif r.spans:
                path = "/".join(s.name for s in r.spans)
                groups.setdefault(path, []).append(
                    (rank, r.spans_at(now, grace)[-1].since))
            else:
                groups.setdefault("", []).append((rank, None))
        where = tuple(
            StageGroup(stage, tuple(r for r, _ in members),
                       min((s for _, s in members if s is not None), default=None))
            for stage, members in sorted(groups.items(), key=lambda kv: -len(kv[1])))
        heard = [r.heard for r in stream.ranks.values()]
        reference = stream.periods.reference()
        recent = stream.periods.recent[-1] if stream.periods.recent else None
        return LivenessView(
            stream.run, stream.role, stream.state, stream.since, now, stream.last_step,
            stream.last_step_at, max(heard) if heard else None, stream.periods.typical(),
            self._threshold(stream, now),
            max(stream.world_size, len(stream.ranks)), where, stream.stuck,
            stream.gpus_per_rank if stream.gpus_per_rank is not None else p.gpus_per_rank,
            recent / reference if recent is not None and reference else None,
            stream.heartbeats,
            tuple(sorted(_ends(stream), key=lambda e: e.rank)),
            tuple(role for role in failed_roles if role != stream.role),
            stream.processes if stream.state in (RunState.DEAD, RunState.FROZEN) else None,
            stream.sightings if stream.state in (RunState.DEAD, RunState.FROZEN) else (),
            stream.overdue, stream.first_heard, stream.ended_how,
            stream.total_steps or self._totals.get(stream.run),
            tuple(RankSeen(rank, "/".join(s.name for s in r.spans or r.stage),
                           r.process.hostname if r.process is not None else "",
                           r.process.node_id if r.process is not None else "", r.heard,
                           r.last_step)
                  for rank, r in sorted(stream.ranks.items())
                  if r.end is not None or (not r.closed and now - r.heard >= grace)
                  )[:_MAX_SEEN], stream.rerun)

    # --- durable knowledge -----------------------------------------------------------------------

    def dump(self) -> dict[Stream, dict[str, Any]]:
        """Each stream's knowledge as JSON-able data (open spans are left out: they come back
        with the next heartbeat)."""
        return {key: s.to_json() for key, s in self._streams.items()}

    def load(self, streams: dict[Stream, dict[str, Any]]) -> None:
        """Continue from :meth:`dump` (a restart): states, periods and who was heard when."""
        for (run, role), obj in streams.items():
            try:
                stream = self._streams[(run, role)] = _Stream.from_json(run, role, obj)
                if stream.total_steps is not None:
                    self._totals[run] = stream.total_steps
            except (KeyError, TypeError, ValueError):
                continue  # an unreadable entry is relearned from the next messages
