"""The forward sink's own behaviour (batching, bounds, retries, ends, names), against a recording
tracker: a stand-in for the Tracker protocol that can be made to block or fail on demand (the
real clients are exercised in test_forward_trackers.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from rlmon.service.alerting.alert_types import AlertEvent
from rlmon.service.config import ForwardConfig, load_config
from rlmon.service.forward.sink import ForwardSink
from rlmon.service.forward.tracker import EndState, ForwardedStep, TrackerRun, metric_key
from rlmon.service.liveness.run_state import LivenessView, RunState
from rlmon.service.service_core import ServiceCore
from tests.support.polling import wait_for
from tests.support.records import step_record


class Recording:
    """Records every call; ``gate`` (cleared) blocks calls, ``failures`` makes the next calls
    raise."""

    name = "recording"

    def __init__(self) -> None:
        self.calls: list[tuple[str, TrackerRun, Any]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.failures = 0
        self.entered = threading.Event()

    def _enter(self) -> None:
        self.entered.set()
        self.gate.wait(30)
        if self.failures:
            self.failures -= 1
            raise ConnectionError("tracker down")

    def log(self, run: TrackerRun, settings: Mapping[str, str],
            steps: Sequence[ForwardedStep]) -> None:
        self._enter()
        self.calls.append(("log", run, list(steps)))

    def alerts(self, run: TrackerRun, settings: Mapping[str, str],
               events: Sequence[AlertEvent]) -> None:
        self._enter()
        self.calls.append(("alerts", run, list(events)))

    def settings(self, run: TrackerRun, settings: Mapping[str, str]) -> None:
        self._enter()
        self.calls.append(("settings", run, dict(settings)))

    def end(self, run: TrackerRun, state: EndState) -> None:
        self._enter()
        self.calls.append(("end", run, state))

    def release(self, run: TrackerRun) -> None:
        self.calls.append(("release", run, None))

    def steps(self) -> list[ForwardedStep]:
        return [s for kind, _r, batch in self.calls if kind == "log" for s in batch]


def _config(**fields: Any) -> ForwardConfig:
    return ForwardConfig(**{"flush_seconds": 3600.0, "retry_initial_seconds": 0.001,
                            **fields})


def _records(n: int, run: str = "r", role: str = "actor") -> list[Any]:
    return [step_record(run=run, role=role, step=i, metrics={"actor/kl": i / 7},
                        finalized_at=1_700_000_000.0 + i) for i in range(n)]


def _view(run: str, role: str, state: RunState) -> LivenessView:
    now = time.time()
    return LivenessView(run, role, state, now, now, 1, now, now, 1.0, 60.0, 1)


def test_steps_leave_in_batches_of_one_run_in_order_with_exact_values() -> None:
    tracker = Recording()
    sink = ForwardSink(_config(batch_steps=4), [tracker])
    sink.start()
    sink.observe(_records(10))
    wait_for(lambda: len(tracker.steps()) == 8, 10, "two full batches")
    assert sink.flush(10)
    batches = [len(b) for kind, _r, b in tracker.calls if kind == "log"]
    assert batches == [4, 4, 2]
    assert [(s.step, dict(s.values)) for s in tracker.steps()] == [
        (i, {"actor/kl": i / 7}) for i in range(10)]
    sink.close(5)


def test_a_tracker_that_blocks_never_delays_the_caller_and_overflow_is_dropped_counted(
) -> None:
    tracker = Recording()
    tracker.gate.clear()  # the tracker hangs
    sink = ForwardSink(_config(batch_steps=1, queue_steps=5), [tracker])
    sink.start()
    sink.observe(_records(1))
    assert tracker.entered.wait(10)  # the thread is stuck inside the tracker
    done = threading.Event()

    def feed() -> None:
        for record in _records(20)[1:]:
            sink.observe([record])
        done.set()

    threading.Thread(target=feed, daemon=True).start()
    assert done.wait(10), "observe waited on a hung tracker"
    stats = sink.stats()[0]
    assert (stats.queued_steps, stats.steps_dropped) == (5, 14)
    assert sink.removed() == {("forward", "recording_steps_dropped"): 14}
    tracker.gate.set()
    assert sink.flush(10)
    assert [s.step for s in tracker.steps()] == [0, 15, 16, 17, 18, 19]  # the newest kept
    sink.close(5)


def test_a_tracker_that_is_down_is_retried_and_counted_until_it_takes_the_batch() -> None:
    tracker = Recording()
    tracker.failures = 3
    sink = ForwardSink(_config(batch_steps=2), [tracker])
    sink.start()
    sink.observe(_records(2))
    assert sink.flush(10)
    stats = sink.stats()[0]
    assert (stats.failures, stats.steps_sent, stats.steps_dropped) == (3, 2, 0)
    assert [s.step for s in tracker.steps()] == [0, 1]
    sink.close(5)


def test_a_run_ends_once_every_role_ended_with_the_worst_state_and_reopens_on_a_step() -> None:
    tracker = Recording()
    sink = ForwardSink(_config(), [tracker])
    sink.start()
    sink.observe(_records(1, role="actor") + _records(1, role="rollout"))
    sink.observe(views=[_view("r", "actor", RunState.FINISHED)])
    sink.observe(views=[_view("r", "rollout", RunState.RUNNING)])
    assert sink.flush(10)
    assert not [c for c in tracker.calls if c[0] == "end"]  # rollout still runs
    sink.observe(views=[_view("r", "rollout", RunState.FAILED),
                        _view("r", "actor", RunState.FINISHED)])
    sink.observe(views=[_view("r", "rollout", RunState.FAILED)])  # said again: sent once
    assert sink.flush(10)
    assert [(c[1], c[2]) for c in tracker.calls if c[0] == "end"] == [(TrackerRun("r"), "failed")]
    # a step after the end (the run went on): a later end is sent again
    sink.observe(_records(1, role="actor"), views=[_view("r", "actor", RunState.PREEMPTED)])
    assert sink.flush(10)
    assert [c[2] for c in tracker.calls if c[0] == "end"] == ["failed", "failed"]
    sink.close(5)


def test_alerts_and_settings_keep_their_order_with_the_steps() -> None:
    tracker = Recording()
    sink = ForwardSink(_config(batch_steps=100), [tracker])
    sink.start()
    records = _records(3)
    event = AlertEvent("r", "actor", 1, "KLDivergence", "warning", "firing", "actor/kl", 0.1)
    sink.observe(records[:2], [event])
    sink.set_run_info("r", {"framework": "trl", "dp": 2, "cp": None})
    sink.observe(records[2:])
    assert sink.flush(10)
    assert [c[0] for c in tracker.calls] == ["log", "alerts", "settings", "log"]
    assert tracker.calls[2][2] == {"framework": "trl", "dp": "2"}
    sink.close(5)


def test_at_most_max_runs_tracker_runs_stay_open() -> None:
    tracker = Recording()
    sink = ForwardSink(_config(max_runs=2), [tracker])
    sink.start()
    for run in ("a", "b", "c"):
        sink.observe(_records(1, run=run))
    assert sink.flush(10)
    assert [c[1].run for c in tracker.calls if c[0] == "release"] == ["a"]
    sink.close(5)
    assert sorted(c[1].run for c in tracker.calls if c[0] == "release") == ["a", "b", "c"]


def test_names_are_the_catalogs_or_the_frameworks_own_prefixed_by_role() -> None:
    assert metric_key("actor", "actor/kl") == "actor/kl"
    assert metric_key("rollout", "perf/step_seconds") == "rollout/perf/step_seconds"
    assert metric_key("actor", "actor/clip_ratio", "openrlhf", "framework") == \
        "actor/ppo_clip_ratio"
    assert metric_key("actor", "actor/clip_ratio", "verl", "framework") == "actor/pg_clipfrac"
    assert metric_key("actor", "actor/clip_ratio", "trl", "framework") == \
        "actor/clip_ratio/region_mean"
    assert metric_key("actor", "actor/kl", "", "framework") == "actor/kl"  # home-grown loop
    assert TrackerRun("a.b:c").id != TrackerRun("a-b-c").id
    assert TrackerRun("run", 2).name == "run#2"


def test_the_service_queues_but_starts_no_thread_until_asked() -> None:
    settings = load_config(None)
    tracker = Recording()
    forward = ForwardSink(settings.forward, [tracker])  # a sink of one's own, beside the service's
    core = ServiceCore(settings, sinks=[forward])
    try:
        core.publish(_records(3))
        assert forward.stats()[0].queued_steps == 3 and not tracker.calls
        assert core.spine.sinks[ForwardSink].stats() == []  # the built-in one: no tracker set
        assert not [t for t in threading.enumerate() if t.name.startswith("rlmon-forward")]
        forward.start()
        assert forward.flush(10)
        assert [s.step for s in tracker.steps()] == [0, 1, 2]
    finally:
        core.close(1.0)


def test_forward_config_errors_name_the_field() -> None:
    with pytest.raises(ValueError, match=r"forward\.queue_steps"):
        load_config(None, forward={"queue_steps": 0})
    with pytest.raises(ValueError, match=r"forward\.wandb\.mode"):
        load_config(None, forward={"wandb": {"mode": "cloud"}})


def test_a_partial_batch_leaves_after_flush_seconds_without_a_flush() -> None:
    tracker = Recording()
    sink = ForwardSink(_config(batch_steps=100, flush_seconds=0.05), [tracker])
    sink.start()
    sink.observe(_records(3))
    wait_for(lambda: len(tracker.steps()) == 3, 30, "the partial batch, by time")
    sink.close(5)
