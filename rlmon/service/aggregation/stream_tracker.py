"""Which (run, role) streams and runs the service keeps in memory.

A stream stays while it reports: it leaves ``ttl`` seconds after its last step, ``finished_ttl``
seconds after its run said it finished, and at once when ``max_streams`` more recent streams
crowd it out (the least recently seen leaves first). Leaving memory loses nothing: the alert state
of a stream is saved with every step in the history store and is read back when the stream
reports again. A run (its metadata, the relayed keys already checked) leaves with its last
stream, or ``ttl`` after metadata that no step followed; at most ``max_streams`` runs are kept.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass, field

__all__ = ["Expired", "Stream", "StreamTracker"]

Stream = tuple[str, str]  # (run, role)


@dataclass(slots=True)
class Expired:
    """What left memory: forget these streams' and runs' state."""

    streams: list[Stream] = field(default_factory=list)
    runs: list[str] = field(default_factory=list)


class StreamTracker:
    def __init__(self, ttl: float, finished_ttl: float, max_streams: int) -> None:
        self.ttl = ttl
        self.finished_ttl = finished_ttl
        self.max_streams = max_streams
        self._streams: OrderedDict[Stream, float] = OrderedDict()  # least recently seen first
        self._runs: OrderedDict[str, float] = OrderedDict()  # last step or metadata per run
        self._roles: Counter[str] = Counter()  # streams per run
        self._finished: dict[str, float] = {}
        self.expired_total = 0  # streams that went quiet or finished
        self.evicted_total = 0  # streams crowded out by max_streams

    def __contains__(self, stream: object) -> bool:
        return stream in self._streams

    def __len__(self) -> int:
        return len(self._streams)

    @property
    def runs(self) -> int:
        return len(self._runs)

    def seen(self, stream: Stream, now: float) -> Expired:
        """A step of ``stream`` arrived; returns what was evicted to make room for it."""
        run = stream[0]
        finished = self._finished.get(run)
        if finished is not None and now - finished >= self.finished_ttl:
            del self._finished[run]  # steps long after the end: the run resumed
        if stream not in self._streams:
            self._roles[run] += 1
        self._streams[stream] = now
        self._streams.move_to_end(stream)
        self._touch(run, now)
        out = Expired()
        while len(self._streams) > self.max_streams:
            oldest, _ = self._streams.popitem(last=False)
            out.streams.append(oldest)
            self._drop_stream_of(oldest[0], out)
        self.evicted_total += len(out.streams)
        return out

    def touch_run(self, run: str, now: float) -> Expired:
        """Run metadata arrived (perhaps before any step)."""
        self._touch(run, now)
        out = Expired()
        while len(self._runs) > self.max_streams:
            oldest, _ = self._runs.popitem(last=False)
            self._forget_run(oldest, out)
        return out

    def finish(self, run: str, now: float) -> None:
        if run in self._runs:
            self._finished[run] = now

    def expire(self, now: float) -> Expired:
        """Remove and return what went quiet or finished, and the runs left without a stream."""
        out = Expired()
        for stream, at in list(self._streams.items()):
            if self._gone(stream[0], at, now):
                del self._streams[stream]
                out.streams.append(stream)
                self._drop_stream_of(stream[0], out)
        self.expired_total += len(out.streams)
        for run, at in list(self._runs.items()):
            if not self._roles[run] and self._gone(run, at, now):
                self._forget_run(run, out)
        return out

    def _gone(self, run: str, at: float, now: float) -> bool:
        finished = self._finished.get(run)
        return now - at >= self.ttl or (finished is not None and now - finished >= self.finished_ttl)

    def _touch(self, run: str, now: float) -> None:
        self._runs[run] = max(now, self._runs.get(run, now))
        self._runs.move_to_end(run)

    def _drop_stream_of(self, run: str, out: Expired) -> None:
        self._roles[run] -= 1
        if self._roles[run] <= 0:
            self._forget_run(run, out)

    def _forget_run(self, run: str, out: Expired) -> None:
        if self._roles.get(run, 0) > 0:  # a run crowded out whole, streams and all
            for stream in [s for s in self._streams if s[0] == run]:
                del self._streams[stream]
                out.streams.append(stream)
        self._runs.pop(run, None)
        self._roles.pop(run, None)
        self._finished.pop(run, None)
        out.runs.append(run)
