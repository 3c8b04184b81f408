"""Aggregator throughput, finalization latency, exporter scrape time and memory, in one run.

Figures:
  * merge throughput (metric partials per second, one actor's core, in-process) at 8, 128 and
    1,024 ranks x 200 metrics: the columnar path (what the Reporter sends) against the core's
    per-partial merge of the same content as contract records (the baseline);
  * time from a step's last partial to its StepRecord (1,024 ranks x 200 metrics): the ingest
    call of the last rank's message, which completes and finalizes the step;
  * exporter scrape at 10,000 series (prometheus_client exposition of our collector), wall and
    thread CPU time, against the same samples in plain prometheus_client gauges (the baseline);
    the budget is 100 ms;
  * replay of one record of a 2^22-rank world with one rank reporting (the missing ranks are
    listed up to a bound, never all 4M) against a 4-rank world (the baseline); budget 10 s;
  * aggregator memory over 10,000 steps (tracemalloc), which must not grow with history.

Run: ``python bench/bench_aggregator.py``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from rlmon.service.aggregation.aggregator import AggregatorCore
from rlmon.service.aggregation.assembly import StepAssembler
from rlmon.service.aggregation.deadline import DeadlinePolicy
from rlmon.service.contract.step_message import Columns, Schema, StepMessage
from rlmon.service.metrics.rank import World
from rlmon.service.metrics.spec import Form

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


class Scrape(NamedTuple):
    wall: float  # median seconds, collect + text exposition
    cpu: float  # the same scrapes' median thread CPU seconds (what load on other cores leaves)
    lines: int  # samples in the exposition
    baseline_wall: float  # the same samples as plain prometheus_client gauges
    baseline_cpu: float


def _timed(fn: Callable[[], bytes], repeats: int = 10) -> tuple[float, float, bytes]:
    fn()  # warm
    walls, cpus = [], []
    body = b""
    for _ in range(repeats):
        c, t = time.thread_time(), time.perf_counter()
        body = fn()
        walls.append(time.perf_counter() - t)
        cpus.append(time.thread_time() - c)
    return statistics.median(walls), statistics.median(cpus), body


def scrape(series: int = 10_000) -> Scrape:
    """Our collector's exposition of ``series`` series against the baseline: the very same
    samples held in ordinary prometheus_client gauges (what a hand-written exporter would keep)."""
    from prometheus_client import CollectorRegistry, Gauge, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from rlmon.service.contract.step_record import StepRecord
    from rlmon.service.export.exporter import MetricsState
    from rlmon.service.export.http import build_registry
    from rlmon.service.metrics import catalog

    names = [spec.name for spec in catalog.metrics()]
    state = MetricsState(max_series=series * 2)
    run = 0
    while state.series < series:
        state.update(StepRecord(f"run{run}", "actor", 1, True, 1, 1, (),
                                {n: float(i) for i, n in enumerate(names)}))
        run += 1
    registry = build_registry(state, process=False)
    wall, cpu, body = _timed(lambda: generate_latest(registry))
    baseline = CollectorRegistry(auto_describe=False)
    gauges: dict[str, Gauge] = {}
    lines = 0
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            keys = sorted(sample.labels)
            if sample.name not in gauges:
                gauges[sample.name] = Gauge(sample.name, family.documentation or sample.name,
                                            keys, registry=baseline)
            gauge = gauges[sample.name]
            (gauge.labels(**sample.labels) if keys else gauge).set(sample.value)
            lines += 1
    base_wall, base_cpu, _ = _timed(lambda: generate_latest(baseline))
    return Scrape(wall, cpu, lines, base_wall, base_cpu)


def huge_world(dp: int = 1 << 20, cp: int = 4) -> tuple[float, float]:
    """Seconds to replay one record of a dp x cp world with one rank reporting (the step lists a
    bounded number of missing ranks), and the same for a 4-rank world (the baseline)."""
    import json

    from rlmon.service.replay import replay

    def once(world: dict[str, int]) -> float:
        line = json.dumps({"run": "r", "role": "actor", "step": 0, "rank": {"dp": 0},
                           "world": world, "metrics": {"m": {"sum": 1.0}}})
        t = time.perf_counter()
        result = replay([line])
        elapsed = time.perf_counter() - t
        assert len(result.steps) == 1 and not result.errors
        return elapsed

    big = statistics.median(once({"dp": dp, "cp": cp}) for _ in range(3))
    small = statistics.median(once({"dp": 2, "cp": 2}) for _ in range(3))
    return big, small


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
    sc = scrape()
    print(f"  exporter scrape of {sc.lines} samples: {sc.wall * 1e3:.1f} ms wall, "
          f"{sc.cpu * 1e3:.1f} ms thread CPU; plain prometheus_client gauges (baseline) "
          f"{sc.baseline_wall * 1e3:.1f} ms wall, {sc.baseline_cpu * 1e3:.1f} ms CPU "
          f"(x{sc.cpu / sc.baseline_cpu:.2f} of the baseline's CPU); budget 100 ms: "
          f"{'meets' if sc.cpu < 0.1 else 'misses'} (x{sc.cpu / 0.1:.2f} of it)")
    big, small = huge_world()
    print(f"  replay of one record of a 2^22-rank world (one rank reporting): {big * 1e3:.1f} ms "
          f"vs a 4-rank world {small * 1e3:.2f} ms (x{big / small:.0f}); budget 10 s: "
          f"{'meets' if big < 10 else 'misses'}")
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
