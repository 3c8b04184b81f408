"""The heartbeat: what a Reporter's sender thread says every few seconds, whatever its training
thread is doing.

Per rank it names the spans open at that moment (outermost first, each with the unix time it
opened) and the last step the rank ended. A hung training thread keeps its spans open and the
sender keeps sending them, so the aggregator sees where each rank is stuck; a dead process
sends nothing, which is how the aggregator tells a dead run from a hung one. ``closing`` is the
Reporter's last word on a clean close: the stream finished, it did not die. See docs/liveness.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
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

__all__ = ["MAX_OPEN_SPANS", "Heartbeat", "OpenSpan", "RankBeat", "check_heartbeat"]

MAX_OPEN_SPANS = 32  # nesting levels a heartbeat names per rank (the outermost ones)
MAX_BEAT_RANKS = 4096  # ranks one heartbeat may speak for
_MAX_NAME = 128


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
    closing: bool = False  # the Reporter closed cleanly: its ranks finished
    gpus_per_rank: float = 1.0  # for the cost of a stall (GPU-hours)


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
    return Heartbeat(check_run(beat.run), check_role(beat.role), world, tuple(ranks),
                     _finite(beat.sent, "sent"), bool(beat.closing), gpus)
