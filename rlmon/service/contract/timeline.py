"""Step timelines: where one rank's step spent its time, span by span.

A rank's :class:`Timeline` holds its step's start and end and the spans closed in it (start,
end, nesting depth, a few attributes), in unix nanoseconds: the Reporter reads a monotonic clock
and aligns it to wall time once per process, so spans of one process never jump with the wall
clock and ranks on different hosts line up as well as their clocks do. Spans are bounded per
step (:data:`MAX_SPANS`); what was cut is counted in ``cut`` and travels with the rest.

The timeline rides inside the step message (no extra call on the training thread); the
assembler keeps the ranks' timelines beside the step (per rank, never merged) and hands them to
the service with the :class:`~rlmon.service.contract.step_record.StepRecord`, where
:func:`find_straggler` names
the rank and the span that made the step slow, the history store keeps them, and
``rlmon trace`` draws them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import median
from typing import Any

from rlmon.service.contract.records import MAX_STEP, ContractError, check_integer, check_rank, show
from rlmon.service.metrics.rank import Rank

__all__ = [
    "MAX_ATTRS",
    "MAX_DEPTH",
    "MAX_SPANS",
    "MAX_TEXT",
    "MAX_TIMELINE_RANKS",
    "RankTimeline",
    "Span",
    "Straggler",
    "Timeline",
    "attrs_of",
    "check_rank_timeline",
    "check_timeline",
    "clean_text",
    "find_straggler",
]

MAX_SPANS = 512  # spans kept per rank and step; the rest are counted in Timeline.cut
MAX_DEPTH = 32  # nesting levels
MAX_ATTRS = 8  # attributes per span
MAX_TEXT = 128  # characters of a span name, an attribute key or text value, a host name
MAX_TIMELINE_RANKS = 4096  # ranks' timelines the assembler keeps per step (the rest counted)

AttrValue = str | int | float | bool
Attrs = tuple[tuple[str, AttrValue], ...]


@dataclass(frozen=True, slots=True)
class Span:
    """One timed phase of a rank's step: ``[start_ns, end_ns)`` in unix nanoseconds."""

    name: str
    start_ns: int
    end_ns: int
    depth: int = 0  # 0: directly in the step; n: inside n enclosing spans
    attrs: Attrs = ()

    @property
    def seconds(self) -> float:
        return (self.end_ns - self.start_ns) * 1e-9


@dataclass(frozen=True, slots=True)
class Timeline:
    """One rank's step: when it started and ended (unix ns), its spans, how many were cut,
    and where it ran (host name and process id, for the trace's process tracks)."""

    start_ns: int
    end_ns: int
    spans: tuple[Span, ...] = ()
    cut: int = 0
    host: str = ""
    pid: int = 0

    @property
    def seconds(self) -> float:
        return (self.end_ns - self.start_ns) * 1e-9

    def to_json(self) -> dict[str, Any]:
        return {
            "start": self.start_ns, "end": self.end_ns, "cut": self.cut, "host": self.host,
            "pid": self.pid,
            "spans": [[s.name, s.start_ns, s.end_ns, s.depth, dict(s.attrs)] for s in self.spans],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Timeline:
        return cls(
            int(data["start"]), int(data["end"]),
            tuple(Span(name, int(start), int(end), int(depth), tuple(attrs.items()))
                  for name, start, end, depth, attrs in data["spans"]),
            int(data["cut"]), str(data["host"]), int(data["pid"]),
        )


@dataclass(frozen=True, slots=True)
class RankTimeline:
    """A timeline and the rank it came from, as the assembler hands it to the service."""

    rank: Rank
    timeline: Timeline

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank.as_dict(), **self.timeline.to_json()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RankTimeline:
        return cls(Rank(**data["rank"]), Timeline.from_json(data))


def _text(value: Any, field: str) -> str:
    if not isinstance(value, str) or len(value) > MAX_TEXT or not value.isprintable():
        raise ContractError(field, f"must be printable text of at most {MAX_TEXT} chars, "
                            f"got {show(value)}")
    return value


def _attr_value(value: Any, field: str) -> AttrValue:
    if isinstance(value, bool | int | str):
        if isinstance(value, str):
            return _text(value, field)
        if not isinstance(value, bool):
            return check_integer(value, field, low=-MAX_STEP, high=MAX_STEP)
        return value
    if isinstance(value, float) and math.isfinite(value):
        return value
    raise ContractError(field, f"must be text, an integer, a finite float or a bool, "
                        f"got {show(value)}")


def clean_text(value: Any) -> str:
    """Any value as contract text: printable, at most :data:`MAX_TEXT` chars, never empty."""
    text = "".join(c if c.isprintable() else "?" for c in str(value)[:MAX_TEXT])
    return text or "?"


def attrs_of(given: Mapping[str, Any]) -> Attrs:
    """A span's attributes as the contract takes them: at most :data:`MAX_ATTRS`, text cut
    to :data:`MAX_TEXT` chars, anything but a number or a bool shown as text (the Reporter
    normalizes what a user passed, off the training thread)."""
    out: list[tuple[str, AttrValue]] = []
    for key, value in list(given.items())[:MAX_ATTRS]:
        nonfinite = isinstance(value, float) and not math.isfinite(value)
        huge = isinstance(value, int) and not -MAX_STEP <= value <= MAX_STEP
        if nonfinite or huge or not isinstance(value, bool | int | float | str):
            value = repr(value)
        if isinstance(value, str):
            value = clean_text(value) if value else value
        out.append((clean_text(key), value))
    return tuple(out)


def check_timeline(value: Any, field: str = "timeline") -> Timeline | None:
    """The contract's checks on a message's timeline (from any producer), or ContractError
    naming the field: integer nanoseconds with end >= start, at most :data:`MAX_SPANS` spans
    nested at most :data:`MAX_DEPTH` deep, at most :data:`MAX_ATTRS` attributes each."""
    if value is None:
        return None
    if not isinstance(value, Timeline):
        raise ContractError(field, f"must be a Timeline, got {show(value)}")
    high = 2**63 - 1
    start = check_integer(value.start_ns, f"{field}.start_ns", high=high)
    end = check_integer(value.end_ns, f"{field}.end_ns", high=high)
    if end < start:
        raise ContractError(f"{field}.end_ns", f"ends ({end}) before it starts ({start})")
    check_integer(value.cut, f"{field}.cut")
    if not isinstance(value.host, str) or len(value.host) > MAX_TEXT:
        raise ContractError(f"{field}.host", f"must be text of at most {MAX_TEXT} chars, "
                            f"got {show(value.host)}")
    check_integer(value.pid, f"{field}.pid", high=2**31 - 1)
    spans = value.spans
    if not isinstance(spans, tuple):
        raise ContractError(f"{field}.spans", f"must be a tuple of Spans, got {show(spans)}")
    if len(spans) > MAX_SPANS:
        raise ContractError(f"{field}.spans", f"{len(spans)} spans exceed the limit of "
                            f"{MAX_SPANS} per rank and step (cut the rest and count them)")
    for i, span in enumerate(spans):
        where = f"{field}.spans[{i}]"
        if not isinstance(span, Span):
            raise ContractError(where, f"must be a Span, got {show(span)}")
        _text(span.name, f"{where}.name")
        if not span.name:
            raise ContractError(f"{where}.name", "must not be empty")
        s = check_integer(span.start_ns, f"{where}.start_ns", high=high)
        e = check_integer(span.end_ns, f"{where}.end_ns", high=high)
        if e < s:
            raise ContractError(f"{where}.end_ns", f"ends ({e}) before it starts ({s})")
        check_integer(span.depth, f"{where}.depth", high=MAX_DEPTH)
        attrs = span.attrs
        if not isinstance(attrs, tuple) or len(attrs) > MAX_ATTRS:
            raise ContractError(f"{where}.attrs", f"must be a tuple of at most {MAX_ATTRS} "
                                f"(key, value) pairs, got {show(attrs)}")
        for pair in attrs:
            if not isinstance(pair, tuple) or len(pair) != 2:
                raise ContractError(f"{where}.attrs", f"must hold (key, value) pairs, "
                                    f"got {show(pair)}")
            key = _text(pair[0], f"{where}.attrs")
            _attr_value(pair[1], f"{where}.attrs.{key}")
    return value


def check_rank_timeline(value: Any, field: str = "timeline") -> RankTimeline:
    """A node merger's kept timeline (it comes over Ray): a rank and a checked timeline."""
    if not isinstance(value, RankTimeline):
        raise ContractError(field, f"must be a RankTimeline, got {show(value)}")
    check_rank(value.rank, f"{field}.rank")
    check_timeline(value.timeline, field)
    return value


@dataclass(frozen=True, slots=True)
class Straggler:
    """The slowest rank of a step, and the span that made it slow.

    A rank's time is its *busy* time, the seconds in its outermost spans (its whole step when it
    recorded none): in synchronous training every rank's step lasts as long as the slowest one's,
    the others wait for it in a collective, outside their spans. ``ratio`` is the rank's busy time
    over the median rank's; ``span`` the span (by name, its occurrences in the step added up)
    whose time on this rank exceeds the median rank's time in the same span by the most
    (``span_excess`` seconds), '' when no span explains it.
    """

    rank: Rank
    ratio: float
    seconds: float
    median_seconds: float
    span: str = ""
    span_excess: float = 0.0

    def describe(self) -> str:
        where = " ".join(f"{axis}={n}" for axis, n in self.rank.as_dict().items())
        text = (f"rank {where} is the slowest: busy {self.seconds:.3g} s, {self.ratio:.3g}x "
                f"the median rank's {self.median_seconds:.3g} s")
        if self.span:
            text += f"; span {self.span!r} took {self.span_excess:.3g} s longer than the median"
        return text


def _span_totals(timeline: Timeline) -> dict[str, tuple[float, int]]:
    """Seconds per span name (occurrences added up) and the name's shallowest depth."""
    totals: dict[str, tuple[float, int]] = {}
    for span in timeline.spans:
        seconds, depth = totals.get(span.name, (0.0, span.depth))
        totals[span.name] = (seconds + span.seconds, min(depth, span.depth))
    return totals


def _busy(timeline: Timeline) -> float:
    """Seconds in the outermost spans; the whole step for a rank that recorded none."""
    outer = [span.seconds for span in timeline.spans if span.depth == 0]
    return sum(outer) if outer else timeline.seconds


def find_straggler(timelines: Sequence[RankTimeline]) -> Straggler | None:
    """The slowest rank of a step (by busy time, see :class:`Straggler`) and the span behind it;
    None with fewer than two ranks or a zero median.

    Among spans whose excess is within 5 % of the largest, the deepest is named: an enclosing
    span (``train``) is as slow as the nested one (``backward``) that made it so.
    """
    if len(timelines) < 2:
        return None
    durations = [_busy(t.timeline) for t in timelines]
    mid = median(durations)
    if not mid > 0:
        return None
    slow = max(range(len(timelines)), key=lambda i: (durations[i], -i))
    totals = [_span_totals(t.timeline) for t in timelines]
    best_name, best_excess, best_depth = "", 0.0, -1
    candidates = []
    for name, (seconds, depth) in totals[slow].items():
        typical = median(t.get(name, (0.0, 0))[0] for t in totals)
        candidates.append((seconds - typical, depth, name))
    top = max((c[0] for c in candidates), default=0.0)
    if top > 0:
        for excess, depth, name in sorted(candidates, key=lambda c: c[2]):
            if excess >= 0.95 * top and depth > best_depth:
                best_name, best_excess, best_depth = name, excess, depth
    return Straggler(timelines[slow].rank, durations[slow] / mid, durations[slow], mid,
                     best_name, best_excess)
