"""Read a Perfetto trace back with Perfetto's own protobuf classes (the ``perfetto`` package) and
check the rules its trace processor applies to TrackEvent data, so a file that passes opens in
ui.perfetto.dev as drawn: every track is declared once before use (a thread under a declared
process), events come in timestamp order, slices open and close in nesting order on their track,
counter values go to counter tracks only."""

from __future__ import annotations

from dataclasses import dataclass, field

from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

__all__ = ["Slice", "TraceView", "read_trace"]

TE = pb.TrackEvent


@dataclass(slots=True)
class Slice:
    name: str
    start: int
    end: int
    depth: int
    annotations: dict[str, object]


@dataclass(slots=True)
class TraceView:
    processes: dict[int, str] = field(default_factory=dict)  # uuid -> process name
    threads: dict[int, tuple[str, str]] = field(default_factory=dict)  # uuid -> (process, name)
    # uuid -> (process name, track name): counters and other tracks under a process
    tracks: dict[int, tuple[str, str]] = field(default_factory=dict)
    counters: dict[tuple[str, str], list[tuple[int, float]]] = field(default_factory=dict)
    instants: dict[tuple[str, str], list[tuple[int, str, dict[str, object]]]] = field(
        default_factory=dict)
    slices: dict[tuple[str, str], list[Slice]] = field(default_factory=dict)  # by (proc, thread)


def _annotations(event: pb.TrackEvent) -> dict[str, object]:
    out: dict[str, object] = {}
    for ann in event.debug_annotations:
        kind = ann.WhichOneof("value")
        out[ann.name] = getattr(ann, kind) if kind else None
    return out


def read_trace(data: bytes) -> TraceView:
    trace = pb.Trace.FromString(data)  # Perfetto's schema; raises on a malformed file
    assert trace.packet, "an empty trace"
    view = TraceView()
    pids: dict[int, str] = {}
    counter_tracks: set[int] = set()
    open_: dict[int, list[tuple[str, int, dict[str, object]]]] = {}
    last_ts = 0
    first = trace.packet[0]
    assert first.sequence_flags & pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
    for packet in trace.packet:
        assert packet.trusted_packet_sequence_id == first.trusted_packet_sequence_id
        if packet.HasField("track_descriptor"):
            desc = packet.track_descriptor
            assert desc.uuid and desc.uuid not in view.processes | view.threads | view.tracks, \
                f"track {desc.uuid} declared twice"
            if desc.HasField("process"):
                view.processes[desc.uuid] = desc.process.process_name
                pids[desc.process.pid] = desc.process.process_name
            elif desc.HasField("thread"):
                assert desc.thread.pid in pids, "a thread of an undeclared process"
                view.threads[desc.uuid] = (pids[desc.thread.pid], desc.thread.thread_name)
            else:
                assert desc.parent_uuid in view.processes, "a track under an undeclared parent"
                view.tracks[desc.uuid] = (view.processes[desc.parent_uuid], desc.name)
                if desc.HasField("counter"):
                    counter_tracks.add(desc.uuid)
            continue
        assert packet.HasField("track_event"), f"unexpected packet {packet}"
        event, ts = packet.track_event, packet.timestamp
        assert ts >= last_ts, "events out of timestamp order"
        last_ts = ts
        track = event.track_uuid
        if event.type == TE.TYPE_COUNTER:
            assert track in counter_tracks, "a counter value on a track that is not a counter"
            view.counters.setdefault(view.tracks[track], []).append(
                (ts, event.double_counter_value))
            continue
        assert track not in counter_tracks, "a slice on a counter track"
        if event.type == TE.TYPE_INSTANT:
            assert track in view.tracks
            view.instants.setdefault(view.tracks[track], []).append(
                (ts, event.name, _annotations(event)))
        elif event.type == TE.TYPE_SLICE_BEGIN:
            assert track in view.threads, "a slice on an undeclared thread"
            open_.setdefault(track, []).append((event.name, ts, _annotations(event)))
        elif event.type == TE.TYPE_SLICE_END:
            stack = open_.get(track)
            assert stack, "a slice end without a begin"
            name, start, annotations = stack.pop()
            view.slices.setdefault(view.threads[track], []).append(
                Slice(name, start, ts, len(stack), annotations))
        else:
            raise AssertionError(f"unexpected event type {event.type}")
    assert not any(open_.values()), "slices left open"
    for slices in view.slices.values():
        slices.sort(key=lambda s: (s.start, s.depth))
    return view
