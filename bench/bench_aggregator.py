"""Aggregator throughput, finalization latency, exporter scrape time and memory, in one run.

Figures:
  * merge throughput (metric partials per second, one actor's core, in-process) at 8, 128 and
    1,024 ranks x 200 metrics: the columnar path (what the Reporter sends) against the core's
    per-partial merge of the same content as contract records (the baseline);
  * time from a step's last partial to its StepRecord (1,024 ranks x 200 metrics): the ingest
    call of the last rank's message, which completes and finalizes the step;
  * exporter scrape at 10,000 series (prometheus_client exposition of our collector);
  * aggregator memory over 10,000 steps (tracemalloc), which must not grow with history.

Run: ``python bench/bench_aggregator.py``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import tracemalloc

import numpy as np

from rlmon.actors.aggregation import AggregatorCore
from rlmon.actors.deadline import DeadlinePolicy
from rlmon.actors.message import Columns, Schema, StepMessage
from rlmon.service.assembly import StepAssembler
from rlmon.service.rank import World
from rlmon.service.spec import Form

N_METRICS = 200
_FORMS = [Form.MEAN] * 150 + [Form.SUM] * 20 + [Form.MIN] * 15 + [Form.MAX] * 15
SCHEMA = Schema.build({f"bench/m{i:03d}": f for i, f in enumerate(_FORMS)})


def messages(ranks: int, step: int, rng: np.random.Generator) -> list[StepMessage]:
    world = World(dp=ranks)
    out = []
    for seq, rank in enumerate(world.ranks()):
        values = rng.random((N_METRICS, 3))
        values[:, 2] = 0.0
        out.append(StepMessage("bench", "actor", step, rank, world, step * ranks + seq, 0.0,
                               Columns(SCHEMA, values)))
    return out


def throughput(ranks: int, steps: int) -> tuple[float, float, float]:
    """(columnar partials/s, core partials/s, median last-partial -> record seconds)."""
    rng = np.random.default_rng(0)
    batches = [messages(ranks, s, rng) for s in range(steps)]
    core = AggregatorCore(deadline=DeadlinePolicy(fixed=600.0))
    finalize = []
    start = time.perf_counter()
    for batch in batches:
        core.ingest(batch[:-1])
        t = time.perf_counter()
        ack = core.ingest(batch[-1:])
        finalize.append(time.perf_counter() - t)
        assert ack.finalized == 1
        core.delivered(core.pending_records())
    fast = ranks * steps * N_METRICS / (time.perf_counter() - start)
    # the baseline: the same content as contract records through the core's per-partial merge
    reports = [[r for m in batch for r in m.reports()] for batch in batches[: max(1, steps // 2)]]
    asm = StepAssembler()
    start = time.perf_counter()
    done = 0
    for batch_reports in reports:
        for report in batch_reports:
            _, record = asm.add(report)
            done += record is not None
    slow = ranks * len(reports) * N_METRICS / (time.perf_counter() - start)
    assert done == len(reports)
    return fast, slow, statistics.median(finalize)


def scrape(series: int = 10_000) -> tuple[float, int]:
    from prometheus_client import generate_latest

    from rlmon.service import catalog
    from rlmon.service.exporter import MetricsState
    from rlmon.service.metrics_http import build_registry
    from rlmon.service.step import StepRecord

    names = [spec.name for spec in catalog.metrics()]
    state = MetricsState(max_series=series * 2)
    runs = series // len(names) + 1
    made = 0
    for run in range(runs):
        take = names[: min(len(names), series - made)]
        if not take:
            break
        state.update(StepRecord(f"run{run}", "actor", 1, True, 1, 1, (),
                                {n: float(i) for i, n in enumerate(take)}))
        made += len(take)
    registry = build_registry(state, process=False)
    generate_latest(registry)
    times = []
    for _ in range(10):
        t = time.perf_counter()
        body = generate_latest(registry)
        times.append(time.perf_counter() - t)
    lines = sum(1 for line in body.decode().splitlines() if line and not line.startswith("#"))
    return statistics.median(times), lines


def memory(steps: int = 10_000, ranks: int = 8) -> tuple[float, float]:
    """Traced memory (MiB) after 2,000 and after ``steps`` steps, records delivered as they go.

    The first steps warm Python's free lists (tuples of a rank's coordinates among them), so
    boundedness is judged from 2,000 steps on.
    """
    rng = np.random.default_rng(1)
    core = AggregatorCore(deadline=DeadlinePolicy(fixed=600.0))
    template = messages(ranks, 0, rng)
    tracemalloc.start()
    at_1k = 0.0
    for step in range(steps):
        batch = [StepMessage(m.run, m.role, step, m.rank, m.world, step * ranks + i, 0.0,
                             m.columns) for i, m in enumerate(template)]
        core.ingest(batch)
        core.delivered(core.pending_records())
        if step == 1999:
            at_1k = tracemalloc.get_traced_memory()[0] / 2**20
    end = tracemalloc.get_traced_memory()[0] / 2**20
    tracemalloc.stop()
    return at_1k, end


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memory-steps", type=int, default=10_000)
    args = parser.parse_args(argv)
    print(f"Aggregator, {N_METRICS} metrics per rank (one actor's core, in-process)")
    worst_finalize = 0.0
    rates = []
    for ranks, steps in ((8, 200), (128, 20), (1024, 4)):
        fast, slow, fin = throughput(ranks, steps)
        rates.append(fast)
        worst_finalize = max(worst_finalize, fin) if ranks == 1024 else worst_finalize
        print(f"  {ranks:>5} ranks: {fast / 1e6:6.2f} M partials/s columnar   "
              f"vs core per-partial merge {slow / 1e6:5.2f} M/s   x{fast / slow:5.1f}   "
              f"last partial -> record {fin * 1e3:7.2f} ms")
    seconds, lines = scrape()
    print(f"  exporter scrape of {lines} series: {seconds * 1e3:.1f} ms "
          f"(budget 100 ms: x{seconds / 0.1:.2f} of it)")
    m1, m2 = memory(args.memory_steps)
    print(f"  aggregator memory: {m1:.2f} MiB after 2,000 steps, {m2:.2f} MiB after "
          f"{args.memory_steps:,} steps (x{m2 / m1 if m1 else float('nan'):.2f})")
    ok_rate = min(rates) >= 1e6
    print(f"  budget >= 1 M partials/s: {'meets' if ok_rate else 'misses'} "
          f"(lowest {min(rates) / 1e6:.2f} M/s); 1,024-rank step finalized < 0.5 s after its "
          f"last partial: {'meets' if worst_finalize < 0.5 else 'misses'} "
          f"({worst_finalize * 1e3:.1f} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
