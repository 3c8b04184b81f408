"""A scrape of 10,000 series returns every one (slow: the time such a scrape takes is a budget
measured by bench/bench_aggregator.py, not asserted)."""

from __future__ import annotations

import pytest

from rlmon.service.export.exporter import MetricsState
from rlmon.service.metrics import catalog
from tests.support.records import step_record
from tests.support.scrape import labels, scrape


@pytest.mark.slow
def test_scrape_of_10k_series_returns_every_series() -> None:
    """10,000 series in one scrape, every one with its value and labels (the time such a scrape
    takes is a budget, measured by bench/bench_aggregator.py, not asserted here)."""
    state = MetricsState(max_series=20_000)
    specs = list(catalog.metrics())[:40]
    runs = 10_000 // (len(specs) + 7) + 1
    for i in range(runs):
        metrics = {spec.name: float(i * 100 + j) for j, spec in enumerate(specs)}
        state.update(step_record(run=f"run-{i}", step=1, ranks_expected=8, metrics=metrics))
    assert state.series == runs * (len(specs) + 7) >= 10_000
    got = scrape(state)
    want = {(spec.prometheus_name, labels(run=f"run-{i}", role="actor")): float(i * 100 + j)
            for i in range(runs) for j, spec in enumerate(specs)}
    assert {k: got.get(k) for k in want} == want
    per_stream = [k for k in got if dict(k[1]).keys() == {"run", "role"}]
    assert len(per_stream) == state.series
    assert got[("rlmon_exporter_series_refused_total", ())] == 0
