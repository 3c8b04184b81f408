"""The ingest counters of /metrics are the aggregator shards' AggregatorStats summed (one type
for what the aggregators counted) and the service's own count of redelivered steps."""

from __future__ import annotations

from rlmon.service.aggregation.aggregator_stats import AggregatorStats
from rlmon.service.service_core import ServiceCore
from tests.support.records import step_record
from tests.support.scrape import scrape

T0 = 1_700_000_000.0


def test_each_shard_s_latest_counts_are_summed_and_redeliveries_counted() -> None:
    core = ServiceCore(clock=lambda: T0)
    try:
        core.publish([step_record(step=0, finalized_at=T0)], shard=0,
                     stats=AggregatorStats(partials=5, rejected=1, reporter_dropped=2))
        core.publish([step_record(step=0, run="b", finalized_at=T0)], shard=1,
                     stats=AggregatorStats(partials=7, late=3, reporter_refused=4, restarts=1,
                                           resent=2))
        # shard 0's newer snapshot replaces its older one; the step is already stored
        core.publish([step_record(step=0, finalized_at=T0)], shard=0,
                     stats=AggregatorStats(partials=6, rejected=1, reporter_dropped=2))
        got = {name: value for (name, _labels), value in scrape(core.metrics).items()}
        assert {name: got[name] for name in (
            "rlmon_partials_ingested_total", "rlmon_partials_rejected_total",
            "rlmon_partials_late_total", "rlmon_partials_dropped_total",
            "rlmon_statistics_refused_total", "rlmon_run_restarts_total",
            "rlmon_steps_redelivered_total", "rlmon_partials_resent_total")} == {
            "rlmon_partials_ingested_total": 13, "rlmon_partials_rejected_total": 1,
            "rlmon_partials_late_total": 3, "rlmon_partials_dropped_total": 2,
            "rlmon_statistics_refused_total": 4, "rlmon_run_restarts_total": 1,
            "rlmon_steps_redelivered_total": 1, "rlmon_partials_resent_total": 2}
    finally:
        core.close(0.0)
