"""Bounded per-stream maps never turn into a lost batch (issue 23, defect c)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlmon.service.aggregation.aggregator import AggregatorCore
from rlmon.service.aggregation.watermark import WatermarkStore
from rlmon.service.contract.step_message import StepMessage, columns_from_states
from rlmon.service.metrics.rank import Rank, World
from rlmon.service.metrics.spec import Form


def _message(run: str, step: int = 0) -> StepMessage:
    cols = columns_from_states({"actor/loss": (Form.MEAN, (1.0, 2.0))})
    return StepMessage(run, "actor", step, Rank(), World(), 1, 0.0, cols)


@pytest.mark.parametrize("bound", [100, 1_000])
def test_a_batch_with_more_streams_than_the_bound_finalizes_every_step(
        tmp_path: Path, bound: int) -> None:
    store = WatermarkStore(tmp_path / "w.sqlite")
    core = AggregatorCore(store=store, max_streams=bound)
    batch = [_message(f"run-{i}") for i in range(2 * bound + 1)]
    ack = core.ingest(batch)
    assert ack.finalized == len(batch)
    assert ack.rejected == 0
    delivered = core.pending_records(limit=10 * bound)
    assert sorted(r.run for r in delivered) == sorted(m.run for m in batch)
    again = core.ingest(batch)  # a resend of the same batch: duplicates or late, never an error
    assert again.finalized == 0
    core.delivered(delivered)
    core.ingest([_message("one-more")])  # the next message brings the bound back
    assert len(core.streams) <= bound
    store.close()


def test_the_bound_is_kept_after_the_batch(tmp_path: Path) -> None:
    core = AggregatorCore(store=WatermarkStore(tmp_path / "w.sqlite"), max_streams=10)
    core.ingest([_message(f"run-{i}") for i in range(25)])
    core.delivered(core.pending_records(limit=100))
    core.ingest([_message("late-comer")])
    assert len(core.streams) <= 10
