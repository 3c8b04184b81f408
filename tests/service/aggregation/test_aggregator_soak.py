"""An hour of simulated time through the aggregator, new runs and metric names arriving all along:
memory and the watermark store stay flat (issue: bounded memory and state)."""

from __future__ import annotations

import gc
import tracemalloc
from pathlib import Path

import pytest

from rlmon.service.aggregation.aggregator import AggregatorCore
from rlmon.service.aggregation.watermark import WatermarkStore
from rlmon.service.contract.step_message import StepMessage, columns_from_states
from rlmon.service.metrics.rank import Rank, World
from rlmon.service.metrics.spec import Form
from tests.support.clock import FakeClock

pytestmark = pytest.mark.slow  # a soak: an hour of simulated traffic

SECOND = 1.0
HOUR = 3600 * SECOND


def _message(run: str, step: int, names: list[str], dp: int = 0) -> StepMessage:
    cols = columns_from_states({name: (Form.MEAN, (1.0, 2.0)) for name in names})
    return StepMessage(run, "actor", step, Rank(dp=dp), World(dp=1), step + 1, 0.0, cols)


def test_an_hour_of_new_runs_and_names_keeps_memory_and_store_flat(tmp_path: Path) -> None:
    clock = FakeClock(0.0)
    store = WatermarkStore(tmp_path / "watermark-0.sqlite")  # the file and its WAL: disk
    core = AggregatorCore(store=store, clock=clock, wall_clock=lambda: 1e9 + clock.now,
                          stream_ttl=300.0, retention=600.0)
    samples: dict[str, tuple[float, int, int, int, int]] = {}
    tracemalloc.start()
    try:
        minute = 0
        while clock.now < HOUR:
            # every 10 s: a one-step run with 50 metric names of its own, and the long run's step
            run = f"short-{int(clock.now)}"
            names = [f"custom/{run}/m{i}" for i in range(50)]
            core.ingest([_message(run, 0, names)])
            step = int(clock.now // 10)
            core.ingest([_message("long", step, ["actor/loss"])])
            core.delivered(core.pending_records(limit=10_000))
            core.tick()
            clock.advance(10 * SECOND)
            if int(clock.now // 60) != minute:
                minute = int(clock.now // 60)
                if minute in (15, 60):
                    gc.collect()
                    samples[f"{minute} min"] = (
                        tracemalloc.get_traced_memory()[0] / 2**20,
                        len(core.streams),
                        len(core.assembler.finalized),
                        len(store.load_streams()),
                        sum(p.stat().st_size for p in tmp_path.glob("watermark-0.sqlite*")),
                    )
    finally:
        tracemalloc.stop()
    early, late = samples["15 min"], samples["60 min"]
    print("soak (traced MiB, streams in memory, finalized sets, streams in store, disk bytes):",
          samples)
    # 270 more runs and 13,500 more names came between the two samples
    assert late[1] <= early[1] + 2 and late[2] <= early[2] + 2  # streams held in memory
    assert late[3] <= early[3] + 2  # streams in the store (retention 600 s)
    assert late[0] < early[0] * 1.25 + 0.25, samples  # traced MiB
    assert late[4] <= early[4] * 1.25 + 65536, samples  # bytes on disk
    stats = core.stats()
    assert stats.streams_forgotten > 300
    assert stats.streams_pruned > 250
    assert stats.names_forgotten > 10_000


def test_a_stream_back_after_leaving_memory_is_read_back_from_the_store(tmp_path: Path) -> None:
    clock = FakeClock(0.0)
    core = AggregatorCore(store=WatermarkStore(tmp_path / "w.sqlite"), clock=clock,
                          wall_clock=lambda: 1e9 + clock.now, stream_ttl=60.0)
    core.ingest([_message("back", step, ["actor/loss"]) for step in range(3)])
    core.delivered(core.pending_records())
    clock.now = 1000.0
    core.tick()
    assert ("back", "actor") not in core.assembler.finalized  # it left memory
    ack = core.ingest([_message("back", 1, ["actor/loss"])])  # a resend of a finalized step
    assert ack.late == 1 and core.counters.late == 1  # still known as finalized, not taken anew


def test_steps_opened_beyond_the_limit_are_refused_and_counted() -> None:
    core = AggregatorCore()
    core.assembler.max_open = 3
    world = World(dp=2)  # nothing completes: every step stays open
    msgs = [StepMessage("flood", "actor", step, Rank(), world, step + 1, 0.0,
                        columns_from_states({"actor/loss": (Form.MEAN, (1.0, 1.0))}))
            for step in range(5)]
    ack = core.ingest(msgs)
    assert (ack.accepted, ack.rejected) == (3, 2)
    assert "steps are open, the limit" in ack.errors[0]
    assert core.counters.rejected == 2
