"""The heartbeat: what a Reporter's sender thread says every few seconds, whatever its training
thread is doing.

Per rank it names the spans open at that moment (outermost first, each with the unix time it
opened) and the last step the rank ended. A hung training thread keeps its spans open and the
sender keeps sending them, so the aggregator sees where each rank is stuck; a dead process
sends nothing, which is how the aggregator tells a dead run from a hung one. ``closing`` is the
Reporter's last word: the stream ended and did not vanish. Its ``outcome`` says how the process
ended (a clean close, an uncaught exception, a non-zero exit, a signal), so that a crash is never
read as a finish. ``process`` names the process that sends, so that a silent stream can be told
frozen (its process still exists) from dead (it does not). See docs/liveness.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from rlmon.service.contract.records import (
    ContractError,
    check_integer,
    check_rank,
    check_role,
    check_run,
    check_world,
    show,
)
from rlmon.service.metrics.rank import Rank, World

__all__ = ["MAX_OPEN_SPANS", "Heartbeat", "OpenSpan", "Outcome", "OutcomeKind", "ProcessId",
           "RankBeat", "check_heartbeat"]

MAX_OPEN_SPANS = 32  # nesting levels a heartbeat names per rank (the outermost ones)
MAX_BEAT_RANKS = 4096  # ranks one heartbeat may speak for
_MAX_NAME = 128
MAX_OUTCOME_MESSAGE = 1024  # characters of an exception's message kept
MAX_OUTCOME_FRAMES = 8  # innermost traceback frames kept ("file:line in function")
_MAX_FRAME = 256


class OutcomeKind(StrEnum):
    """How a Reporter's process ended."""

    CLEAN = "clean"  # close(), finish_run(), a with-block left normally, sys.exit(0)
    EXCEPTION = "exception"  # an uncaught exception (main or another thread), a with-block left by one
    EXIT = "exit"  # sys.exit(n) / os._exit path seen at interpreter exit with n != 0
    SIGNAL = "signal"  # a terminating signal (SIGTERM from a preemption, SIGINT)


@dataclass(frozen=True, slots=True)
class Outcome:
    """How the process ended, said once in the closing heartbeat."""

    kind: OutcomeKind
    exc_type: str = ""  # "RuntimeError", "ray.exceptions.RayTaskError(ValueError)", ...
    message: str = ""  # the exception's message, at most MAX_OUTCOME_MESSAGE chars
    frames: tuple[str, ...] = ()  # innermost last, at most MAX_OUTCOME_FRAMES
    exit_code: int | None = None  # EXIT: the code passed to sys.exit
    signal: str = ""  # SIGNAL: its name, "SIGTERM"

    @property
    def failed(self) -> bool:
        return self.kind is not OutcomeKind.CLEAN


@dataclass(frozen=True, slots=True)
class ProcessId:
    """Who sends a heartbeat: enough to ask later whether that process still exists."""

    hostname: str
    pid: int
    node_id: str = ""  # Ray's node id (hex) when the process runs under Ray
    job_id: str = ""  # Ray's job id (hex)
    worker_id: str = ""  # Ray's worker id (hex): the driver's or the actor's worker process
    actor_id: str = ""  # Ray's actor id (hex) when the Reporter lives in an actor


@dataclass(frozen=True, slots=True)
class OpenSpan:
    """A span a rank is inside now: its name and when it opened (unix seconds)."""

    name: str
    since: float


@dataclass(frozen=True, slots=True)
class RankBeat:
    """One rank's situation: its open spans (outermost first) and the last step it ended."""

    rank: Rank
    spans: tuple[OpenSpan, ...] = ()
    last_step: int | None = None

    @property
    def stage(self) -> OpenSpan | None:
        """The innermost open span: where the rank is now."""
        return self.spans[-1] if self.spans else None


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """One Reporter's heartbeat for the ranks it speaks for (usually one)."""

    run: str
    role: str
    world: World
    ranks: tuple[RankBeat, ...]
    sent: float  # unix seconds on the Reporter's clock
    closing: bool = False  # the Reporter's last heartbeat: its ranks ended (see ``outcome``)
    gpus_per_rank: float = 1.0  # for the cost of a stall (GPU-hours)
    outcome: Outcome | None = None  # on the closing heartbeat: how the process ended (None: clean)
    process: ProcessId | None = None  # the sending process, for telling frozen from gone
    # the steps the run plans (its framework's max_steps): once the last of them ended, the run
    # is ending, and its final save or evaluation is not a stall
    total_steps: int | None = None
    # a method of this rank's actor raised this, seen by rlmon's method wrapper (a rank whose
    # driver then ends the run leaves no closing heartbeat); cleared by the rank's next step
    raised: Outcome | None = None


def _finite(value: Any, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ContractError(field, f"must be a finite number, got {show(value)}")
    return float(value)


def _span(value: Any, field: str) -> OpenSpan:
    if not isinstance(value, OpenSpan):
        raise ContractError(field, f"must be an OpenSpan, got {show(value)}")
    name = value.name
    if not isinstance(name, str) or not name or len(name) > _MAX_NAME or not name.isprintable():
        raise ContractError(f"{field}.name", f"must be 1-{_MAX_NAME} printable chars, got "
                            f"{show(name)}")
    return OpenSpan(name, _finite(value.since, f"{field}.since"))


def _text(value: Any, field: str, limit: int) -> str:
    if not isinstance(value, str):
        raise ContractError(field, f"must be a string, got {show(value)}")
    return value[:limit]


def _outcome(value: Any) -> Outcome | None:
    if value is None:
        return None
    if not isinstance(value, Outcome):
        raise ContractError("outcome", f"must be an Outcome, got {show(value)}")
    try:
        kind = OutcomeKind(value.kind)
    except ValueError:
        raise ContractError("outcome.kind", f"must be one of {[k.value for k in OutcomeKind]}, "
                            f"got {show(value.kind)}") from None
    if not isinstance(value.frames, tuple):
        raise ContractError("outcome.frames", f"must be a tuple, got {show(value.frames)}")
    frames = tuple(_text(f, f"outcome.frames[{i}]", _MAX_FRAME)
                   for i, f in enumerate(value.frames[-MAX_OUTCOME_FRAMES:]))
    code = None if value.exit_code is None else check_integer(value.exit_code, "outcome.exit_code",
                                                              low=-(2**31), high=2**31)
    return Outcome(kind, _text(value.exc_type, "outcome.exc_type", _MAX_NAME),
                   _text(value.message, "outcome.message", MAX_OUTCOME_MESSAGE), frames, code,
                   _text(value.signal, "outcome.signal", 32))


def _process(value: Any) -> ProcessId | None:
    if value is None:
        return None
    if not isinstance(value, ProcessId):
        raise ContractError("process", f"must be a ProcessId, got {show(value)}")
    pid = check_integer(value.pid, "process.pid", high=2**31)
    return ProcessId(_text(value.hostname, "process.hostname", 255), pid,
                     *(_text(getattr(value, f), f"process.{f}", _MAX_NAME)
                       for f in ("node_id", "job_id", "worker_id", "actor_id")))


def check_heartbeat(beat: Any) -> Heartbeat:
    """A heartbeat with every field checked, or :class:`ContractError` naming the field."""
    if not isinstance(beat, Heartbeat):
        raise ContractError("heartbeat", f"must be a Heartbeat, got {show(beat)}")
    world = check_world(beat.world)
    if not isinstance(beat.ranks, tuple) or len(beat.ranks) > MAX_BEAT_RANKS:
        raise ContractError("ranks", f"must be a tuple of at most {MAX_BEAT_RANKS} RankBeat")
    ranks = []
    for i, item in enumerate(beat.ranks):
        field = f"ranks[{i}]"
        if not isinstance(item, RankBeat):
            raise ContractError(field, f"must be a RankBeat, got {show(item)}")
        rank = check_rank(item.rank, f"{field}.rank")
        if not world.contains(rank):
            raise ContractError(f"{field}.rank", f"{tuple(rank)} is outside world {tuple(world)}")
        if not isinstance(item.spans, tuple) or len(item.spans) > MAX_OPEN_SPANS:
            raise ContractError(f"{field}.spans", f"must be a tuple of at most {MAX_OPEN_SPANS}")
        spans = tuple(_span(s, f"{field}.spans[{j}]") for j, s in enumerate(item.spans))
        last = None if item.last_step is None else check_integer(item.last_step,
                                                                 f"{field}.last_step")
        ranks.append(RankBeat(rank, spans, last))
    gpus = _finite(beat.gpus_per_rank, "gpus_per_rank")
    if gpus < 0:
        raise ContractError("gpus_per_rank", f"must be >= 0, got {show(gpus)}")
    outcome = _outcome(beat.outcome)
    if outcome is not None and not beat.closing:
        raise ContractError("outcome", "is said only on the closing heartbeat")
    total = getattr(beat, "total_steps", None)
    if total is not None:
        total = check_integer(total, "total_steps", low=1)
    return Heartbeat(check_run(beat.run), check_role(beat.role), world, tuple(ranks),
                     _finite(beat.sent, "sent"), bool(beat.closing), gpus, outcome,
                     _process(beat.process), total, _outcome(getattr(beat, "raised", None)))
