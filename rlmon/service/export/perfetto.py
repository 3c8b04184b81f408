"""A run's step timelines as a Perfetto trace (``rlmon trace``), for https://ui.perfetto.dev.

The file is Perfetto's native protobuf format (``TracePacket`` s with ``TrackEvent`` s), built
with the ``perfetto`` package's own trace builder and proto classes, so the schema is Perfetto's,
not ours. Layout:

- one process track per (role, host), one thread track per rank inside it; on a rank's thread,
  a ``step N`` slice from the step's start to its end, the rank's spans nested inside it (their
  attributes as debug annotations);
- one process track per role for the run as a whole: an ``alerts`` track with an instant per
  alert transition (at the end of its step), and counter tracks of a few key metrics.

Events are written in timestamp order and every slice is closed, so the trace processor needs no
reordering; a child that overruns its parent (clocks of a span that left its step) is clipped.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb
from perfetto.trace_builder.proto_builder import TraceProtoBuilder

from rlmon.service.contract.timeline import Span, Timeline
from rlmon.service.metrics import catalog
from rlmon.service.metrics.rank import Rank
from rlmon.service.storage.history import StepTimelines

__all__ = ["TRACE_COUNTERS", "TraceInput", "build_trace"]

# The key metrics drawn as counter tracks, when a step has them.
TRACE_COUNTERS: tuple[str, ...] = (
    catalog.STEP_SECONDS,
    catalog.STRAGGLER_RATIO,
    catalog.REWARD,
    catalog.LOSS,
    catalog.MEMORY_ALLOCATED_BYTES,
)
_SEQUENCE = 1  # one writer, one packet sequence


@dataclass(frozen=True, slots=True)
class TraceInput:
    """What a trace is drawn from: the stored timelines, the alert lines and the step lines
    (the history store's, as :meth:`~rlmon.service.storage.history.HistoryStore.alerts` and
    :meth:`~rlmon.service.storage.history.HistoryStore.steps` return them)."""

    timelines: Sequence[StepTimelines]
    alerts: Sequence[Mapping[str, Any]] = ()
    steps: Sequence[Mapping[str, Any]] = ()


def _rank_name(rank: Rank) -> str:
    return "rank " + " ".join(f"{axis}={n}" for axis, n in rank.as_dict().items())


def _uuid(*key: object) -> int:
    """A stable 63-bit track id (Perfetto wants them unique and non-zero)."""
    return (zlib.crc32(repr(key).encode()) << 31 | zlib.adler32(repr(key).encode())) & (
        2**63 - 1) or 1


@dataclass(slots=True)
class _Builder:
    builder: TraceProtoBuilder = field(default_factory=TraceProtoBuilder)
    events: list[tuple[int, int, Any]] = field(default_factory=list)  # (ts, order, fill)
    pids: dict[object, int] = field(default_factory=dict)
    tids: dict[object, int] = field(default_factory=dict)
    first: bool = True

    def _packet(self) -> pb.TracePacket:
        packet = self.builder.add_packet()
        packet.trusted_packet_sequence_id = _SEQUENCE
        if self.first:  # the sequence starts here: no state from before it
            packet.first_packet_on_sequence = True
            packet.sequence_flags = pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
            self.first = False
        return packet

    def process(self, key: object, name: str) -> tuple[int, int]:
        """(uuid, pid) of a process track, declared on first use."""
        uuid = _uuid("process", key)
        if key not in self.pids:
            self.pids[key] = pid = len(self.pids) + 1
            desc = self._packet().track_descriptor
            desc.uuid = uuid
            desc.process.pid = pid
            desc.process.process_name = name
        return uuid, self.pids[key]

    def thread(self, process: object, pid: int, key: object, name: str) -> int:
        uuid = _uuid("thread", process, key)
        if (process, key) not in self.tids:
            self.tids[(process, key)] = tid = 1000 + len(self.tids)
            desc = self._packet().track_descriptor
            desc.uuid = uuid
            desc.thread.pid = pid
            desc.thread.tid = tid
            desc.thread.thread_name = name
        return uuid

    def track(self, parent: int, key: object, name: str, counter: bool = False) -> int:
        uuid = _uuid("track", parent, key)
        if (parent, key) not in self.tids:
            self.tids[(parent, key)] = 0
            desc = self._packet().track_descriptor
            desc.uuid = uuid
            desc.parent_uuid = parent
            desc.name = name
            if counter:
                desc.counter.SetInParent()
        return uuid

    def event(self, ts: int, kind: int, track: int, name: str = "",
              annotations: Iterable[tuple[str, object]] = (), value: float | None = None) -> None:
        def fill(event: pb.TrackEvent) -> None:
            event.type = kind
            event.track_uuid = track
            if name:
                event.name = name
            if value is not None:
                event.double_counter_value = value
            for key, item in annotations:
                ann = event.debug_annotations.add()
                ann.name = key
                if isinstance(item, bool):
                    ann.bool_value = item
                elif isinstance(item, int):
                    ann.int_value = item
                elif isinstance(item, float):
                    ann.double_value = item
                else:
                    ann.string_value = str(item)

        self.events.append((ts, len(self.events), fill))

    def serialize(self) -> bytes:
        for ts, _, fill in sorted(self.events, key=lambda e: (e[0], e[1])):
            packet = self._packet()
            packet.timestamp = ts
            fill(packet.track_event)
        return self.builder.serialize()


def _slices(b: _Builder, track: int, step: int, timeline: Timeline) -> None:
    """The step's slice and its spans nested inside, begin/end in nesting order."""
    begin, end = pb.TrackEvent.TYPE_SLICE_BEGIN, pb.TrackEvent.TYPE_SLICE_END
    b.event(timeline.start_ns, begin, track, f"step {step}",
            [("step", step), ("spans_cut", timeline.cut)])
    stack = [timeline.end_ns]  # the end of each open slice, innermost last
    spans: list[Span] = sorted(timeline.spans, key=lambda s: (s.start_ns, -s.end_ns, s.depth))
    for span in spans:
        start = max(span.start_ns, timeline.start_ns)
        while len(stack) > 1 and start >= stack[-1]:
            b.event(stack.pop(), end, track)
        finish = min(max(span.end_ns, start), stack[-1])  # clipped to its parent
        b.event(start, begin, track, span.name, span.attrs)
        stack.append(finish)
    while stack:
        b.event(stack.pop(), end, track)


def build_trace(data: TraceInput) -> bytes:
    """The serialized Perfetto trace of ``data``."""
    b = _Builder()
    step_end: dict[tuple[str, int], int] = {}
    for item in data.timelines:
        for ranked in item.ranks:
            tl = ranked.timeline
            host = tl.host or "?"
            process = (item.role, host)
            _, pid = b.process(process, f"{item.role} @ {host}")
            thread = b.thread(process, pid, ranked.rank, _rank_name(ranked.rank))
            _slices(b, thread, item.step, tl)
            key = (item.role, item.step)
            step_end[key] = max(step_end.get(key, 0), tl.end_ns)
    roles = sorted({role for role, _ in step_end})
    for role in roles:
        run_track, _ = b.process(("run", role), f"{role}: run")
        alerts = b.track(run_track, "alerts", "alerts")
        for line in data.alerts:
            at = step_end.get((str(line["role"]), int(line["step"])))
            if line["role"] != role or at is None:
                continue
            value = line.get("value")
            b.event(at, pb.TrackEvent.TYPE_INSTANT, alerts,
                    f"{line['alert']} {line['state']}",
                    [("severity", str(line["severity"])), ("metric", str(line["metric"])),
                     ("value", float(value) if value is not None else "n/a"),
                     ("step", int(line["step"]))])
        for line in data.steps:
            at = step_end.get((str(line["role"]), int(line["step"])))
            if line["role"] != role or at is None:
                continue
            for name in TRACE_COUNTERS:
                value = line["metrics"].get(name)
                if value is None or not math.isfinite(value):
                    continue
                counter = b.track(run_track, name, name, counter=True)
                b.event(at, pb.TrackEvent.TYPE_COUNTER, counter, value=float(value))
    return b.serialize()
