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
