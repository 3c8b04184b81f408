"""The state of each (run, role) by time, not by steps: running, slow, stalled, dead, finished.

:class:`LivenessTracker` is told what the aggregator hears (step messages, heartbeats, finalized
steps, a clean close) with the unix time it heard it, and :meth:`LivenessTracker.evaluate` is
called on a timer: a run that produces no step still changes state, which is the point. Its
knowledge is plain data (:meth:`LivenessTracker.dump` / :meth:`LivenessTracker.load`) so a
restarted aggregator continues where it stopped instead of waiting to relearn who is dead.

- finished: every rank that spoke closed cleanly, or the run said ``finish_run``;
- dead: the stream heartbeats, and every rank has been silent (no heartbeat, no step) for
  ``dead_after_seconds``;
- stalled: ranks are alive but no step finalized for the stall threshold
  (:mod:`rlmon.service.liveness.thresholds`);
- slow: steps still finalize, but ``slow_steps`` intervals in a row were ``slow_factor`` times
  the run's own baseline;
- running: otherwise.

A stream that never sent a heartbeat (an older Reporter, a replayed file) is never called dead:
silence between its steps is all there is to see, and it is judged a stall.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from rlmon.service.contract.heartbeat import Heartbeat, OpenSpan
from rlmon.service.contract.timeline import Timeline
from rlmon.service.liveness.thresholds import LivenessParams, StepPeriods
from rlmon.service.metrics.rank import Rank

__all__ = ["LivenessTracker", "LivenessView", "RunState", "StageGroup", "StuckStage",
           "rank_label"]

Stream = tuple[str, str]
_MAX_STAGE_NAMES = 256  # span names whose usual duration a stream remembers
_USUAL_DECAY = 0.98  # per step: an old longest span fades over a few hundred steps


class RunState(StrEnum):
    RUNNING = "running"
    SLOW = "slow"
    STALLED = "stalled"
    DEAD = "dead"
    FINISHED = "finished"


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
class StuckStage:
    """One rank far past its usual duration in a stage while other ranks are elsewhere."""

    rank: Rank
    stage: str
    since: float
    usual: float | None  # the stage's usual duration (None: the step period stood in)
    limit: float


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

    @property
    def idle_seconds(self) -> float:
        """Seconds since the last step (or since the stream was first heard)."""
        ref = self.last_step_at if self.last_step_at is not None else self.since
        return max(0.0, self.at - ref)

    @property
    def odd(self) -> tuple[Rank, ...]:
        """Ranks in a different stage from most ranks (the ones to look at first)."""
        heard = [g for g in self.where if g.stage != SILENT]
        if len(heard) < 2:
            return ()
        biggest = max(len(g.ranks) for g in heard)
        majority = [g for g in heard if len(g.ranks) == biggest]
        if len(majority) > 1:  # a tie: the stage entered first is where the hang began
            majority = [max(majority, key=lambda g: g.since or 0.0)]
        return tuple(r for g in heard if g is not majority[0] for r in g.ranks)

    def key(self) -> tuple[Any, ...]:
        """What a change of makes the view worth publishing at once."""
        stuck = (self.stuck.rank, self.stuck.stage) if self.stuck is not None else None
        return self.state, stuck


SILENT = "(silent)"


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


def describe(view: LivenessView) -> str:
    """Where each rank is, who is odd, how long since the last step: the text of a liveness
    alert (its cost is the alert's, :mod:`rlmon.service.goodput.alert_costs`)."""
    parts = []
    for group in view.where:
        stage = ("no heartbeat" if group.stage == SILENT
                 else group.stage or "no open span")
        how_long = f" for {_duration(view.at - group.since)}" if group.since is not None else ""
        parts.append(f"{stage}{how_long}: {len(group.ranks)} rank"
                     f"{'s' if len(group.ranks) != 1 else ''} ({_ranks(group.ranks)})")
    text = "; ".join(parts)
    if view.odd:
        text += f". In a different stage from the rest: {_ranks(view.odd)}"
    if view.stuck is not None:
        s = view.stuck
        usual = f"usually {_duration(s.usual)}" if s.usual is not None else "no usual duration"
        text += (f". Stuck: {rank_label(s.rank)} in {s.stage} for "
                 f"{_duration(view.at - s.since)} ({usual}; limit {_duration(s.limit)})")
    last = f"step {view.last_step}" if view.last_step is not None else "no step yet"
    text += (f". Last step: {last}, {_duration(view.idle_seconds)} ago; stall threshold "
             f"{_duration(view.threshold)}")
    if view.period is not None:
        text += f" (typical step {_duration(view.period)})"
    return text


@dataclass(slots=True)
class _Rank:
    heard: float
    spans: tuple[OpenSpan, ...] = ()
    closed: bool = False


@dataclass(slots=True)
class _Stream:
    run: str
    role: str
    first_heard: float
    world_size: int = 1
    ranks: dict[Rank, _Rank] = field(default_factory=dict)
    heartbeats: bool = False
    last_step: int | None = None
    last_step_at: float | None = None
    steps: int = 0
    periods: StepPeriods = field(default_factory=StepPeriods)
    usual: dict[str, float] = field(default_factory=dict)
    state: RunState = RunState.RUNNING
    since: float = 0.0
    finished: bool = False
    gpus_per_rank: float | None = None
    stuck: StuckStage | None = None
    published: tuple[Any, ...] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "first_heard": self.first_heard, "world_size": self.world_size,
            "ranks": [[list(r), s.heard, s.closed] for r, s in self.ranks.items()],
            "heartbeats": self.heartbeats, "last_step": self.last_step,
            "last_step_at": self.last_step_at, "steps": self.steps,
            "periods": self.periods.to_json(), "usual": self.usual, "state": self.state.value,
            "since": self.since, "finished": self.finished, "gpus_per_rank": self.gpus_per_rank,
        }

    @classmethod
    def from_json(cls, run: str, role: str, obj: dict[str, Any]) -> _Stream:
        stream = cls(run, role, float(obj["first_heard"]), int(obj.get("world_size", 1)))
        stream.ranks = {Rank(*map(int, r)): _Rank(float(at), (), bool(closed))
                        for r, at, closed in obj.get("ranks", ())}
        stream.heartbeats = bool(obj.get("heartbeats"))
        stream.last_step = obj.get("last_step")
        stream.last_step_at = obj.get("last_step_at")
        stream.steps = int(obj.get("steps", 0))
        stream.periods = StepPeriods.from_json(obj.get("periods", {}))
        stream.usual = {str(k): float(v) for k, v in obj.get("usual", {}).items()}
        stream.state = RunState(obj.get("state", "running"))
        stream.since = float(obj.get("since", stream.first_heard))
        stream.finished = bool(obj.get("finished"))
        gpus = obj.get("gpus_per_rank")
        stream.gpus_per_rank = float(gpus) if gpus is not None else None
        stream.published = (stream.state, None)  # what it said before the restart
        return stream


class LivenessTracker:
    """Per (run, role) liveness on the caller's unix clock (``now`` is passed in)."""

    def __init__(self, params: LivenessParams | None = None) -> None:
        self.params = params or LivenessParams()
        self._streams: dict[Stream, _Stream] = {}

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
        for item in beat.ranks:
            seen = stream.ranks.get(item.rank)
            if seen is None:
                seen = stream.ranks[item.rank] = _Rank(now)
            seen.heard = max(seen.heard, now)
            seen.spans = item.spans
            seen.closed = beat.closing
        if not beat.closing and stream.finished and stream.state is RunState.FINISHED:
            stream.finished = False  # heartbeats again after the end: a rerun

    def finalized(self, run: str, role: str, step: int, now: float) -> None:
        """A step of (run, role) finalized at ``now``: progress."""
        stream = self._stream(run, role, now)
        if stream.last_step is not None and step <= stream.last_step:
            return
        if stream.last_step_at is not None:
            slow = stream.state is RunState.SLOW
            stream.periods.add(now - stream.last_step_at, self.params, slow)
        stream.last_step, stream.last_step_at = step, now
        stream.steps += 1
        if stream.finished and stream.state is RunState.FINISHED and not all(
                r.closed for r in stream.ranks.values()):
            stream.finished = False  # steps after finish_run: the run goes on

    def spans(self, run: str, role: str, timeline: Timeline, now: float) -> None:
        """Learn the usual duration of each stage from a rank's step timeline."""
        stream = self._stream(run, role, now)
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

    # --- the timer -------------------------------------------------------------------------------

    def evaluate(self, now: float) -> list[LivenessView]:
        """Re-evaluate every stream at ``now``; returns the views whose state (or stuck stage)
        changed since they were last returned."""
        changed = []
        for stream in self._streams.values():
            view = self._judge(stream, now)
            if view.key() != stream.published:
                stream.published = view.key()
                changed.append(view)
        return changed

    def views(self, now: float) -> list[LivenessView]:
        """Every stream's view at ``now`` (no state change is recorded)."""
        return [self._view(s, now) for s in self._streams.values()]

    def view(self, run: str, role: str, now: float) -> LivenessView | None:
        stream = self._streams.get((run, role))
        return self._view(stream, now) if stream is not None else None

    def _judge(self, stream: _Stream, now: float) -> LivenessView:
        p = self.params
        alive = [r for r in stream.ranks.values()
                 if not r.closed and now - r.heard < p.dead_after_seconds]
        open_ranks = [r for r in stream.ranks.values() if not r.closed]
        progress = stream.last_step_at if stream.last_step_at is not None else stream.first_heard
        threshold = stream.periods.stall_threshold(p, stream.steps)
        if stream.finished or (stream.ranks and not open_ranks):
            state = RunState.FINISHED
        elif stream.heartbeats and not alive:
            state = RunState.DEAD
        elif now - progress > threshold:
            state = RunState.STALLED
        elif stream.periods.is_slow(p) or (stream.state is RunState.SLOW
                                           and not stream.periods.recovered(p)):
            state = RunState.SLOW
        else:
            state = RunState.RUNNING
        if state is not stream.state:
            stream.state, stream.since = state, now
        stream.stuck = self._stuck(stream, now) if state in (
            RunState.RUNNING, RunState.SLOW, RunState.STALLED) else None
        return self._view(stream, now)

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
        for rank, r in alive:
            if not r.spans:
                continue
            span = r.spans[-1]
            if stages[span.name] * 2 > len(alive):
                continue  # most ranks are here: they are the ones waiting
            usual = stream.usual.get(span.name)
            base = usual if usual is not None else period
            if base is None:
                continue  # nothing yet to say what usual is
            limit = max(p.stuck_factor * base, p.stuck_floor_seconds)
            over = (now - span.since) / limit
            if over > 1 and (worst is None or over > worst[0]):
                worst = (over, StuckStage(rank, span.name, span.since, usual, limit))
        return worst[1] if worst is not None else None

    def _view(self, stream: _Stream, now: float) -> LivenessView:
        p = self.params
        groups: dict[str, list[tuple[Rank, float | None]]] = {}
        for rank, r in sorted(stream.ranks.items()):
            if r.closed:
                continue
            if now - r.heard >= p.dead_after_seconds:
                groups.setdefault(SILENT, []).append((rank, r.heard))
            elif r.spans:
                path = "/".join(s.name for s in r.spans)
                groups.setdefault(path, []).append((rank, r.spans[-1].since))
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
            stream.periods.stall_threshold(p, stream.steps),
            max(stream.world_size, len(stream.ranks)), where, stream.stuck,
            stream.gpus_per_rank if stream.gpus_per_rank is not None else p.gpus_per_rank,
            recent / reference if recent is not None and reference else None,
            stream.heartbeats)

    # --- durable knowledge -----------------------------------------------------------------------

    def dump(self) -> dict[Stream, dict[str, Any]]:
        """Each stream's knowledge as JSON-able data (open spans are left out: they come back
        with the next heartbeat)."""
        return {key: s.to_json() for key, s in self._streams.items()}

    def load(self, streams: dict[Stream, dict[str, Any]]) -> None:
        """Continue from :meth:`dump` (a restart): states, periods and who was heard when."""
        for (run, role), obj in streams.items():
            try:
                self._streams[(run, role)] = _Stream.from_json(run, role, obj)
            except (KeyError, TypeError, ValueError):
                continue  # an unreadable entry is relearned from the next messages
