"""The assembler's counts are one field list: the snapshot an aggregator publishes carries each
of them, as it stands (rlmon.service.aggregation.aggregator_stats)."""

from __future__ import annotations

import dataclasses

from rlmon.service.aggregation.aggregator import AggregatorCore
from rlmon.service.aggregation.aggregator_stats import AggregatorStats
from rlmon.service.aggregation.assembly import AssemblyCounters


def test_every_assembly_count_is_a_published_stat_with_its_value() -> None:
    stats_fields = {f.name for f in dataclasses.fields(AggregatorStats)}
    counts = [f.name for f in dataclasses.fields(AssemblyCounters)]
    assert set(counts) <= stats_fields
    core = AggregatorCore()
    for i, name in enumerate(counts, start=1):
        setattr(core.assembler.counters, name, i)
    stats = core.stats()
    assert {name: getattr(stats, name) for name in counts} == {
        name: i for i, name in enumerate(counts, start=1)}


def test_the_shards_counts_add_up_field_by_field_and_what_does_not_add_up_is_left_out() -> None:
    a = AggregatorStats(partials=2, rejected=1, reporter_dropped=4, incarnation="a",
                        finalize_latency_p50=0.5)
    b = AggregatorStats(partials=3, late=2, resent=1, delivery_errors=1, incarnation="b")
    total = AggregatorStats.total([a, b])
    for field in dataclasses.fields(AggregatorStats):
        if field.name in ("incarnation", "finalize_latency_p50"):
            assert getattr(total, field.name) == field.default, field.name
        else:
            assert getattr(total, field.name) == getattr(a, field.name) + getattr(
                b, field.name), field.name
    assert AggregatorStats.total([]) == AggregatorStats()
