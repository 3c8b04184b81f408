"""The aggregator hands its liveness views to the service even while a busy stream's steps keep
it from ever catching up (issue 29: under load, a service slower than one stream's steps never
heard that a frozen run had gone on, and RunFrozen never resolved)."""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

from rlmon.service.aggregation.aggregator import AggregatorCore, AggregatorServer
from rlmon.service.liveness.run_state import LivenessView, RunState
from rlmon.service.liveness.thresholds import LivenessParams
from tests.support.polling import wait_for
from tests.unit.liveness.support import beat, step_message


def _backlogged(core: AggregatorCore, stop: threading.Event) -> tuple[Any, list[int]]:
    """A publish after which the busy stream's next step has always finalized already."""
    steps = itertools.count(1)
    published: list[int] = []

    def publish(records: list[Any], shard: int, stats: Any) -> dict[str, Any]:
        published.extend(r.step for r in records if r.run == "busy")
        if not stop.is_set():
            step = next(steps)
            core.ingest([step_message("busy", step, seq=step + 1)])
        return {}

    core.ingest([step_message("busy", 0, seq=1)])
    return publish, published


def test_liveness_views_reach_the_service_while_steps_keep_arriving() -> None:
    core = AggregatorCore(liveness=LivenessParams(heartbeat_seconds=0.05, evaluate_seconds=0.01))
    stop = threading.Event()
    publish, published = _backlogged(core, stop)
    views: list[LivenessView] = []
    server = AggregatorServer(core, publish, tick_s=0.005,
                              publish_liveness=lambda batch, shard: views.extend(batch)).start()
    try:
        wait_for(lambda: len(published) > 5, 30, "steps handed over")
        assert core.pending_records(1), "the service never catches up in this scenario"
        wait_for(lambda: any(v.run == "busy" for v in views), 30,
                 "a liveness view of the busy stream while its steps are still pending")
    finally:
        stop.set()
        server.close(finalize=False)
    assert published == sorted(published) and len(set(published)) == len(published)


def test_states_are_still_judged_while_a_backlog_of_steps_lasts() -> None:
    """A run that goes silent while another's steps keep the service behind is judged (and said)
    then, not once the backlog clears: the timer runs between hand-overs."""
    core = AggregatorCore(liveness=LivenessParams(
        heartbeat_seconds=0.05, evaluate_seconds=0.01, dead_after_seconds=0.3))
    stop = threading.Event()
    publish, published = _backlogged(core, stop)
    views: list[LivenessView] = []
    core.heartbeat([beat("quiet", 0, 1, spans=(("train", time.time()),), at=time.time())])
    server = AggregatorServer(core, publish, tick_s=0.005,
                              publish_liveness=lambda batch, shard: views.extend(batch)).start()
    try:
        wait_for(lambda: len(published) > 3, 30, "steps handed over")
        silent = wait_for(lambda: [v for v in views if v.run == "quiet"
                                   and v.state is RunState.DEAD], 30,
                          "the silent run judged while the busy one's steps are pending")
        assert core.pending_records(1), "the service caught up: nothing was shown"
        assert silent[0].last_heard is not None
    finally:
        stop.set()
        server.close(finalize=False)


def test_a_run_whose_reporters_closed_just_before_the_aggregator_closes_ends_finished() -> None:
    """A script's Reporters close and its exit shuts the runtime down at once, before the
    liveness timer's next evaluation: the close judges the streams then, so the service hears
    the run finished (and closes the alerts still firing on it) instead of keeping it running,
    its alerts "firing now" in the store for ever."""
    core = AggregatorCore(liveness=LivenessParams(heartbeat_seconds=5.0, evaluate_seconds=3600.0))
    views: list[LivenessView] = []
    server = AggregatorServer(core, lambda records, shard, stats: {}, tick_s=0.005,
                              publish_liveness=lambda batch, shard: views.extend(batch)).start()
    try:
        core.heartbeat([beat("script", 0, 1, last_step=3, at=time.time())])
        wait_for(lambda: any(v.run == "script" for v in views), 30, "the timer's evaluation")
        assert views[-1].state is RunState.RUNNING
        core.heartbeat([beat("script", 0, 1, last_step=3, at=time.time(), closing=True)])
    finally:
        server.close(finalize=True)
    assert views[-1].run == "script" and views[-1].state is RunState.FINISHED
