"""The stream memory: which steps are new, which (run, role) streams and runs the service
keeps in memory, and the history store's retention.

A step the history store already holds (a redelivery after an aggregator restart) is ignored.
Per-(run, role) state leaves memory when the stream goes quiet, finishes or is crowded out
(:mod:`rlmon.service.aggregation.stream_tracker`); it comes back from the history store with the
stream's next step. Nothing leaves during a batch: what the tracker lets go while a batch is
judged is forgotten once the batch is stored (a bound never loses what it holds). What leaves is
counted in ``removed``.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Protocol

from rlmon.service.aggregation.stream_tracker import Expired, Stream, StreamTracker
from rlmon.service.config import RetentionConfig
from rlmon.service.contract.run_info import RunInfo
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.liveness.run_state import LivenessView, RunState
from rlmon.service.spine.verdict import Verdict
from rlmon.service.storage.history import HistoryStore

__all__ = ["Forgets", "StreamMemory"]

_log = logging.getLogger("rlmon.service")
_MAX_FINISHED = 1_000  # runs whose finish_run time is kept


class Forgets(Protocol):
    """What keeps state per stream or run (the judge, the sinks)."""

    def forget(self, expired: Expired) -> None: ...


class StreamMemory:
    """``recall`` brings a stream's alert state back from the history store; ``forgetters``
    drop theirs when a stream or run leaves memory. ``run_info`` is the registry of the runs'
    metadata (the judge and the run page read it)."""

    def __init__(
        self, retention: RetentionConfig, history: HistoryStore, now: float,
        recall: Callable[[Stream], None], forgetters: Sequence[Forgets],
        run_info: dict[str, RunInfo], restored: Iterable[Stream] = (),
    ) -> None:
        """``run_info``: the registry to keep (shared with its readers); ``restored``: the
        streams whose alert state a restart brought back (they age from ``now``)."""
        self._retention, self._history = retention, history
        self._recall, self._forgetters = recall, list(forgetters)
        self.tracker = StreamTracker(retention.stream_ttl_seconds,
                                     retention.finished_ttl_seconds, retention.max_streams)
        self.run_info = run_info
        self.removed: Counter[str] = Counter()  # what retention and expiry took, by kind
        self.redeliveries = 0
        self._finished_runs: dict[str, float] = {}  # run -> unix time it said finish_run
        self._deferred: Expired | None = None  # left the tracker during the batch being judged
        self._next_retention = now + retention.every_seconds
        for stream in sorted(restored):
            self._forget(self.tracker.seen(stream, now))

    def admit(self, records: Sequence[StepRecord], views: Sequence[LivenessView], now: float,
              ) -> tuple[list[StepRecord], list[LivenessView]]:
        """The batch's steps not stored before (in order) and its views (a view of a run that
        said it finished is a finished view); their streams are in memory from now on."""
        fresh = []
        for record in sorted(records, key=lambda r: r.identity):
            if self._history.has_step(*record.key, record.attempt):
                self.redeliveries += 1
                if self.redeliveries == 1:
                    _log.warning("rlmon: %s/%s step %d (attempt %d) is already stored: a "
                                 "redelivery, ignored; counted in "
                                 "rlmon_steps_redelivered_total (said once)", record.run,
                                 record.role, record.step, record.attempt)
                continue
            fresh.append(record)
        # nothing leaves memory before the batch is stored (kept if a failed batch left some)
        self._deferred = self._deferred or Expired()
        seen = []
        for view in views:
            finished = self._finished_runs.get(view.run)
            if finished is not None and view.state is not RunState.FINISHED and (
                    view.last_step_at is None or view.last_step_at <= finished):
                view = replace(view, state=RunState.FINISHED)  # finish_run said so
            seen.append(view)
        for stream in [(r.run, r.role) for r in fresh] + [(v.run, v.role) for v in seen]:
            self._remember(stream, now)
        return fresh, seen

    def settle(self, verdict: Verdict) -> None:
        """The batch is stored: forget what left the tracker during it (unless it came back);
        after a batch of steps, apply the retention when it is due."""
        deferred, self._deferred = self._deferred, None
        if deferred is not None:
            self._forget(Expired([s for s in deferred.streams if s not in self.tracker],
                                 deferred.runs))
        if verdict.kind != "steps":
            return
        self.removed["sample_payloads_cut"] = self._history.sample_payloads_cut
        self.removed["timeline_spans_cut"] += sum(r.timelines_cut for r in verdict.records)
        if verdict.at >= self._next_retention:
            self._retain(verdict.at)

    def remember_run(self, run: str, info: RunInfo, now: float) -> None:
        """A run's metadata: kept while the run is (it may come before the run's first step)."""
        self._forget(self.tracker.touch_run(run, now))
        self.run_info[run] = info

    def finish(self, run: str, now: float) -> None:
        """The run said it finished: its streams leave memory after the finished TTL, and its
        liveness views say finished from now on."""
        self._finished_runs[run] = time.time()  # liveness views are on unix time
        while len(self._finished_runs) > _MAX_FINISHED:
            del self._finished_runs[next(iter(self._finished_runs))]
        self.tracker.finish(run, now)

    def counts(self) -> dict[tuple[str, str], int]:
        """What was removed here, by kind (for ``rlmon_removed_total``)."""
        return {("service", kind): n for kind, n in self.removed.items()}

    def _remember(self, stream: Stream, now: float) -> None:
        """A stream reports: bring its state back from the history store if it had left memory
        (not if it only left the tracker in this batch: its newer state is still in memory)."""
        deferred = self._deferred
        if stream not in self.tracker and (deferred is None or stream not in deferred.streams):
            self._recall(stream)
        self._forget(self.tracker.seen(stream, now))

    def _forget(self, expired: Expired) -> None:
        """Drop what left memory. During a batch it only notes it: a stream crowded out by a
        later stream of the same batch must still be stored with the batch."""
        if self._deferred is not None:
            self._deferred.streams.extend(expired.streams)
            self._deferred.runs.extend(expired.runs)
            return
        if expired.streams or expired.runs:
            for forgetter in self._forgetters:
                forgetter.forget(expired)
            for run in expired.runs:
                self.run_info.pop(run, None)
        self.removed["streams_forgotten"] += len(expired.streams)
        self.removed["runs_forgotten"] += len(expired.runs)

    def _retain(self, now: float) -> None:
        """Expire quiet or finished streams from memory; apply the history retention."""
        retention = self._retention
        self._next_retention = now + retention.every_seconds
        self._forget(self.tracker.expire(now))
        pruned = self._history.prune(retention.history_steps,
                                     now - retention.history_days * 86_400.0,
                                     retention.timeline_steps, retention.sample_steps)
        self.removed["history_samples"] += pruned.samples
        self.removed["history_timelines"] += pruned.timelines
        self.removed["history_steps"] += pruned.steps
        self.removed["history_alerts"] += pruned.alerts
        self.removed["history_runs"] += len(pruned.runs)
