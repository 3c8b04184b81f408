"""The forward sink: what the service feeds with finalized steps, alert transitions, run settings
and liveness views, and what sends them to each configured tracker.

The service's calls only append to bounded in-memory queues (one per tracker) under a short lock:
they never wait on a tracker, so an alert is never delayed by one. Each tracker has a thread of
its own (started by :meth:`ForwardSink.start`, which the service actor calls; a constructor starts
nothing), which sends steps in batches (``batch_steps``, or what waited ``flush_seconds``) and
everything else as it comes, in the order it came. A call that raises (a tracker down, a network
error) is retried with exponential backoff and counted; meanwhile new steps wait in the queue, and
past ``queue_steps`` the oldest of them are dropped and counted (``queue_events`` bounds the
rest). Nothing else is kept per run beyond a bounded table of the runs seen.

A run's end state comes from the liveness views: when every role the sink has seen of a run has
ended (finished, failed or preempted; a dead stream counts as failed), the worst of them is the
run's end, sent once; a step of the run after that opens the tracker run again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlmon.service.alerting.alert_types import AlertEvent
from rlmon.service.config import ForwardConfig
from rlmon.service.contract.run_info import RunInfo
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.forward.tracker import (
    EndState,
    ForwardedStep,
    Tracker,
    TrackerRun,
    metric_key,
)
from rlmon.service.liveness.run_state import LivenessView, RunState
from rlmon.service.spine.sink import StepSink
from rlmon.service.spine.verdict import Verdict

__all__ = ["ForwardSink", "ForwardStats", "build_trackers"]

log = logging.getLogger("rlmon.forward")

_END: Mapping[RunState, EndState] = {
    RunState.FINISHED: "finished", RunState.FAILED: "failed", RunState.DEAD: "failed",
    RunState.PREEMPTED: "preempted"}
_WORST: tuple[EndState, ...] = ("failed", "preempted", "finished")
_MAX_RUNS_SEEN = 10_000  # runs whose roles and settings the sink remembers (least recent leave)


@dataclass(frozen=True, slots=True)
class ForwardStats:
    """One tracker's totals since the sink started."""

    tracker: str
    steps_sent: int
    steps_dropped: int  # over queue_steps while the tracker could not keep up
    events_sent: int  # alert batches, settings and ends
    events_dropped: int
    failures: int  # calls that raised (each retried)
    queued_steps: int
    queued_events: int
    unsent_at_close: int = 0  # items still queued when close gave up waiting


@dataclass(frozen=True, slots=True)
class _Item:
    kind: str  # "steps" | "alerts" | "settings" | "end"
    run: TrackerRun
    record: StepRecord | None = None
    events: tuple[AlertEvent, ...] = ()
    end: EndState | None = None


class _Worker:
    """One tracker's queue and thread."""

    def __init__(self, tracker: Tracker, config: ForwardConfig,
                 settings_of: Callable[[str], tuple[Mapping[str, str], str]]) -> None:
        self.tracker = tracker
        self.config = config
        self._settings_of = settings_of
        self._cond = threading.Condition()
        self._queue: deque[_Item] = deque()
        self._steps = 0  # step items queued
        self._oldest: float | None = None  # monotonic time the oldest queued step came
        self._busy = False  # the thread holds items taken off the queue
        self._flush = False
        self._stop = False
        self._thread: threading.Thread | None = None
        self._open: OrderedDict[TrackerRun, None] = OrderedDict()
        self._said = False  # the first drop is logged
        self.sent_steps = self.dropped_steps = self.sent_events = self.dropped_events = 0
        self.failures = self.unsent = 0

    # --- intake (the service's threads) --------------------------------------------------------

    def put(self, items: Iterable[_Item]) -> None:
        with self._cond:
            for item in items:
                self._queue.append(item)
                if item.kind == "steps":
                    self._steps += 1
                    if self._oldest is None:
                        self._oldest = time.monotonic()
            self._bound()
            # the thread decides: a full batch or another item goes now, a partial batch when
            # its oldest step has waited flush_seconds (the thread's wait starts from here)
            self._cond.notify_all()

    def _bound(self) -> None:
        """Drop the oldest steps over ``queue_steps``, the oldest other items over
        ``queue_events`` (counted); called with the lock held."""
        cfg = self.config
        events = len(self._queue) - self._steps
        if self._steps <= cfg.queue_steps and events <= cfg.queue_events:
            return
        kept: deque[_Item] = deque()
        excess_steps = self._steps - cfg.queue_steps
        excess_events = events - cfg.queue_events
        for item in self._queue:
            if item.kind == "steps" and excess_steps > 0:
                excess_steps -= 1
                self._steps -= 1
                self.dropped_steps += 1
            elif item.kind != "steps" and excess_events > 0:
                excess_events -= 1
                self.dropped_events += 1
            else:
                kept.append(item)
        if not self._said:
            self._said = True
            log.warning("rlmon: forward to %s: the tracker does not keep up; the oldest queued "
                        "items are dropped (counted in rlmon_state_removed_total{component=\"forward\"}; "
                        "said once)", self.tracker.name)
        self._queue = kept

    # --- the thread ----------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, daemon=True,
                                            name=f"rlmon-forward-{self.tracker.name}")
            self._thread.start()

    def _take(self) -> list[_Item] | None:
        """The next items to send (a batch of one run's steps, or one other item); None when
        stopped and nothing is left."""
        cfg = self.config
        with self._cond:
            while True:
                if self._queue:
                    head = self._queue[0]
                    age = time.monotonic() - (self._oldest or 0.0)
                    ready = (head.kind != "steps" or self._flush or self._stop
                             or self._steps >= cfg.batch_steps or age >= cfg.flush_seconds
                             or len(self._queue) > self._steps)
                    if ready:
                        break
                    self._cond.wait(cfg.flush_seconds - age)
                    continue
                self._flush = False
                self._cond.notify_all()  # flush() waiters: nothing queued, nothing held
                if self._stop:
                    return None
                self._cond.wait()
            taken = [self._queue.popleft()]
            if head.kind == "steps":
                while (self._queue and len(taken) < cfg.batch_steps
                       and self._queue[0].kind == "steps" and self._queue[0].run == head.run):
                    taken.append(self._queue.popleft())
                self._steps -= len(taken)
                self._oldest = time.monotonic() if self._steps else None
            self._busy = True
            return taken

    def _loop(self) -> None:
        while True:
            items = self._take()
            if items is None:
                return
            try:
                self._send(items)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _send(self, items: list[_Item]) -> None:
        """One tracker call for ``items``, retried with backoff until it succeeds or the sink
        stops."""
        delay = self.config.retry_initial_seconds
        streak = 0
        while True:
            try:
                self._call(items)
            except Exception as exc:  # a tracker down or refusing: retried, counted
                self.failures += 1
                streak += 1
                if streak == 1:
                    log.warning("rlmon: forward to %s failed (%s: %s); retrying with backoff",
                                self.tracker.name, type(exc).__name__, exc)
                with self._cond:
                    if self._stop:
                        self.unsent += len(items)
                        return
                    self._cond.wait(delay)
                    if self._stop:
                        self.unsent += len(items)
                        return
                delay = min(delay * 2, self.config.retry_max_seconds)
                continue
            if streak:
                log.warning("rlmon: forward to %s works again after %d failed attempts",
                            self.tracker.name, streak)
            if items[0].kind == "steps":
                self.sent_steps += len(items)
            else:
                self.sent_events += 1
            return

    def _call(self, items: list[_Item]) -> None:
        head = items[0]
        run, tracker = head.run, self.tracker
        settings, framework = self._settings_of(run.run)
        if head.kind == "end":
            assert head.end is not None
            tracker.end(run, head.end)
            self._open.pop(run, None)
            return
        self._touch(run)
        if head.kind == "steps":
            names = self.config.names
            steps = []
            for item in items:
                record = item.record
                assert record is not None
                steps.append(ForwardedStep(
                    record.role, record.step, record.finalized_at or time.time(),
                    {metric_key(record.role, name, framework, names): value
                     for name, value in record.metrics.items()}))
            tracker.log(run, settings, steps)
        elif head.kind == "alerts":
            tracker.alerts(run, settings, head.events)
        else:
            tracker.settings(run, settings)

    def _touch(self, run: TrackerRun) -> None:
        """Keep at most ``max_runs`` tracker runs open: the least recently used is released."""
        self._open.pop(run, None)
        self._open[run] = None
        while len(self._open) > self.config.max_runs:
            oldest = next(iter(self._open))
            del self._open[oldest]
            self.tracker.release(oldest)

    # --- control -------------------------------------------------------------------------------

    def flush(self, timeout: float) -> bool:
        """Send what is queued now (not waiting for a full batch); True when all was sent
        within ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._flush = True
            self._cond.notify_all()
            while self._queue or self._busy:
                left = deadline - time.monotonic()
                if left <= 0 or self._thread is None:
                    return False
                self._cond.wait(left)
            return True

    def close(self, timeout: float) -> None:
        self.flush(timeout)
        with self._cond:
            self._stop = True
            self.unsent += len(self._queue)
            self._queue.clear()
            self._steps = 0
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
        for run in list(self._open):
            try:
                self.tracker.release(run)
            except Exception as exc:
                log.warning("rlmon: forward to %s: closing run %s: %s", self.tracker.name,
                            run.name, exc)
        self._open.clear()

    def stats(self) -> ForwardStats:
        with self._cond:
            return ForwardStats(self.tracker.name, self.sent_steps, self.dropped_steps,
                                self.sent_events, self.dropped_events, self.failures,
                                self._steps, len(self._queue) - self._steps, self.unsent)


def build_trackers(config: ForwardConfig) -> list[Tracker]:
    """The trackers the config enables (each imports its client library here)."""
    out: list[Tracker] = []
    if config.wandb.enabled:
        from rlmon.service.forward.wandb_tracker import WandbTracker

        out.append(WandbTracker(config.wandb))
    if config.mlflow.enabled:
        from rlmon.service.forward.mlflow_tracker import MlflowTracker

        out.append(MlflowTracker(config.mlflow))
    if config.tensorboard.enabled:
        from rlmon.service.forward.tensorboard_tracker import TensorBoardTracker

        out.append(TensorBoardTracker(config.tensorboard))
    return out


class ForwardSink(StepSink):
    """Fans the service's finalized steps, alerts, settings and run ends out to the trackers
    (one of the service's sinks: :mod:`rlmon.service.spine.sink`). After the commit, as before
    the spine: a tracker is sent only steps that were stored, so a batch delivered again after a
    failed write is not logged twice."""

    def __init__(self, config: ForwardConfig, trackers: Sequence[Tracker] | None = None) -> None:
        """``trackers`` None: the ones ``config`` enables."""
        self.config = config
        self._lock = threading.Lock()
        self._runs: OrderedDict[str, _RunSeen] = OrderedDict()
        chosen = build_trackers(config) if trackers is None else list(trackers)
        self._workers = [_Worker(t, config, self._settings_of) for t in chosen]

    @property
    def enabled(self) -> bool:
        return bool(self._workers)

    def start(self) -> None:
        """Start one forwarding thread per tracker (idempotent)."""
        for worker in self._workers:
            worker.start()

    def _settings_of(self, run: str) -> tuple[Mapping[str, str], str]:
        with self._lock:
            seen = self._runs.get(run)
            return (dict(seen.settings), seen.framework) if seen else ({}, "")

    def _seen(self, run: str) -> _RunSeen:
        seen = self._runs.pop(run, None) or _RunSeen()
        self._runs[run] = seen
        while len(self._runs) > _MAX_RUNS_SEEN:
            del self._runs[next(iter(self._runs))]
        return seen

    def observe(self, records: Sequence[StepRecord] = (), events: Sequence[AlertEvent] = (),
                views: Sequence[LivenessView] = ()) -> None:
        """What the service stored: finalized steps, alert transitions, liveness views. Only
        queues (never waits on a tracker)."""
        if not self._workers:
            return
        items: list[_Item] = []
        with self._lock:
            for record in records:
                seen = self._seen(record.run)
                seen.roles.setdefault(record.role, None)
                seen.attempt = max(seen.attempt, record.attempt)
                seen.ended = False
                items.append(_Item("steps", TrackerRun(record.run, record.attempt), record))
            by_run: dict[TrackerRun, list[AlertEvent]] = {}
            for event in events:
                if not event.repeat:  # a re-send is not a transition
                    by_run.setdefault(TrackerRun(event.run, event.attempt), []).append(event)
            items.extend(_Item("alerts", run, events=tuple(batch))
                         for run, batch in by_run.items())
            touched = []
            for view in views:
                seen = self._seen(view.run)
                seen.roles[view.role] = _END.get(view.state)
                touched.append(view.run)
            for run in dict.fromkeys(touched):
                seen = self._runs[run]
                ends = list(seen.roles.values())
                if seen.ended or not ends or None in ends:
                    continue
                seen.ended = True
                state = next(s for s in _WORST if s in ends)
                items.append(_Item("end", TrackerRun(run, seen.attempt), end=state))
        for worker in self._workers:
            worker.put(items)

    def record(self, verdict: Verdict) -> None:
        if self._workers:
            self.observe(verdict.records, verdict.events, verdict.views)

    def run_info(self, run: str, info: RunInfo) -> None:
        self.set_run_info(run, info.labels(), info.framework)

    def set_run_info(self, run: str, settings: Mapping[str, Any], framework: str = "") -> None:
        """The run's settings (what its integration reported), logged with its tracker run."""
        if not self._workers:
            return
        shown = {k: str(v) for k, v in settings.items() if v not in ("", None)}
        with self._lock:
            seen = self._seen(run)
            if shown == seen.settings and framework == seen.framework:
                return
            seen.settings, seen.framework = shown, framework
            attempt = seen.attempt
        for worker in self._workers:
            worker.put([_Item("settings", TrackerRun(run, attempt))])

    def flush(self, timeout: float = 30.0) -> bool:
        """Send everything queued now; True when every tracker took it within ``timeout``."""
        deadline = time.monotonic() + timeout
        return all([w.flush(max(0.0, deadline - time.monotonic())) for w in self._workers])

    def close(self, timeout: float = 5.0) -> None:
        """Send what is queued (up to ``timeout``), stop the threads, close the tracker runs
        (without an end state: the service stopping is not the run ending)."""
        deadline = time.monotonic() + timeout
        for worker in self._workers:
            worker.close(max(0.0, deadline - time.monotonic()))

    def stats(self) -> list[ForwardStats]:
        return [w.stats() for w in self._workers]

    def removed(self) -> dict[tuple[str, str], int]:
        """What the sink dropped, for ``rlmon_removed_total`` (component "forward")."""
        out: dict[tuple[str, str], int] = {}
        for s in self.stats():
            for kind, n in ((f"{s.tracker}_steps_dropped", s.steps_dropped),
                            (f"{s.tracker}_events_dropped", s.events_dropped),
                            (f"{s.tracker}_unsent_at_close", s.unsent_at_close)):
                if n:
                    out[("forward", kind)] = n
        return out


class _RunSeen:
    """What the sink knows of a run: its roles (and each one's end, None while it runs), its
    latest attempt, its settings and framework, and whether its end was sent."""

    __slots__ = ("attempt", "ended", "framework", "roles", "settings")

    def __init__(self) -> None:
        self.roles: dict[str, EndState | None] = {}
        self.attempt = 0
        self.settings: dict[str, str] = {}
        self.framework = ""
        self.ended = False
