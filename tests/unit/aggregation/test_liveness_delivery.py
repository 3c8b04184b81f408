"""The aggregator hands its liveness views to the service even while a busy stream's steps keep
it from ever catching up (issue 29: under load, a service slower than one stream's steps never
heard that a frozen run had gone on, and RunFrozen never resolved)."""

from __future__ import annotations

import itertools
import threading
from typing import Any

from rlmon.service.aggregation.aggregator import AggregatorCore, AggregatorServer
from rlmon.service.liveness.run_state import LivenessView
from rlmon.service.liveness.thresholds import LivenessParams
from tests.support.polling import wait_for
from tests.unit.liveness.support import step_message


def test_liveness_views_reach_the_service_while_steps_keep_arriving() -> None:
    core = AggregatorCore(liveness=LivenessParams(heartbeat_seconds=0.05, evaluate_seconds=0.01))
    steps = itertools.count()
    published: list[int] = []
    views: list[LivenessView] = []
    stop = threading.Event()

    def publish(records: list[Any], shard: int, stats: Any) -> dict[str, Any]:
        published.extend(r.step for r in records)
        if not stop.is_set():  # the stream's next step finalized while this batch was handed
            step = next(steps)
            core.ingest([step_message("busy", step, seq=step + 1)])
        return {}

    def publish_liveness(batch: list[LivenessView], shard: int) -> None:
        views.extend(batch)

    core.ingest([step_message("busy", next(steps), seq=1)])
    server = AggregatorServer(core, publish, tick_s=0.005, publish_liveness=publish_liveness)
    try:
        wait_for(lambda: len(published) > 5, 30, "steps handed over")
        assert core.pending_records(1), "the service never catches up in this scenario"
        wait_for(lambda: any(v.run == "busy" for v in views), 30,
                 "a liveness view of the busy stream while its steps are still pending")
    finally:
        stop.set()
        server.close(finalize=False)
    assert published == sorted(published) and len(set(published)) == len(published)
