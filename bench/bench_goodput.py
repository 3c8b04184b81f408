"""What goodput accounting costs at 1,024 ranks, against the step's finalization in the same process.

The accounting never runs on a training rank: the Reporter only records spans (two clock reads and
a tuple per span, measured in bench_reporter.py). The aggregator finalizes the step as before (it
keeps the ranks' timelines whether or not goodput is on); the service joins the roles' records,
classifies every rank's spans and derives idle from the other ranks' timelines.

Figures (one step of 1,024 trainer ranks x 200 metrics, 24 spans each with nesting, and 64
rollout engines):
  * the baseline: the aggregator's finalization of the step, the ingest of its last rank's
    message (which completes and finalizes it), median over steps;
  * account_step on the step's timelines (the pure accounting), median;
  * the service path: GoodputLedger.add of the step's records (on the alert path: it only
    holds them), and GoodputLedger.account after the step's alerts are out (the join, the
    accounting of the step two steps back with its neighbours, the counters), median;
  * each as microseconds per step and as a ratio to the finalization.

Run: ``python bench/bench_goodput.py [--ranks 1024] [--steps 7]``.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time

import numpy as np

from rlmon.service.aggregation.aggregator import AggregatorCore
from rlmon.service.aggregation.deadline import DeadlinePolicy
from rlmon.service.contract.step_message import Columns, Schema, StepMessage
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.contract.timeline import RankTimeline, Span, Timeline
from rlmon.service.goodput.accounting import RoleTimelines, StepInput, account_step
from rlmon.service.goodput.buckets import SpanMap
from rlmon.service.goodput.ledger import GoodputLedger
from rlmon.service.metrics import catalog
from rlmon.service.metrics.rank import Rank, World
from rlmon.service.metrics.spec import Form

N_METRICS = 200
_FORMS = [Form.MEAN] * 150 + [Form.SUM] * 20 + [Form.MIN] * 15 + [Form.MAX] * 15
SCHEMA = Schema.build({f"bench/m{i:03d}": f for i, f in enumerate(_FORMS)})
MS = 1_000_000


def trainer_timeline(step: int, rank: int, rng: np.random.Generator) -> Timeline:
    """A verl-like trainer step: old log-probs, reference, then 4 mini-batches of forward,
    backward and optimizer nested in update_actor, a weight update; jitter per rank."""
    t0 = (10**12 + step * 10_000) * MS
    spans = [Span("step", t0, t0 + 9_000 * MS, 0)]
    t = t0 + 3_000 * MS  # waiting for rollouts before
    for name in ("old_log_prob", "ref"):
        d = int((400 + rng.integers(0, 40)) * MS)
        spans.append(Span(name, t, t + d, 1))
        t += d + 5 * MS
    start = t
    for _ in range(4):
        for name, base in (("fwd", 200), ("bwd", 400), ("optimizer_step", 50)):
            d = int((base + rng.integers(0, base // 10)) * MS)
            spans.append(Span(name, t, t + d, 2))
            t += d + MS
    spans.append(Span("update_actor", start, t, 1))
    spans.append(Span("update_weights", t + 10 * MS, t + 300 * MS, 1))
    for i in range(24 - len(spans)):
        spans.append(Span("log", t + (310 + i) * MS, t + (310 + i) * MS + MS // 2, 1))
    return Timeline(t0, t0 + 9_000 * MS, tuple(spans), host=f"node{rank // 8}", pid=rank)


def engine_timeline(step: int, rng: np.random.Generator) -> Timeline:
    t0 = (10**12 + step * 10_000) * MS
    d = int((2_800 + rng.integers(0, 200)) * MS)
    return Timeline(t0, t0 + 9_000 * MS, (Span("generate", t0 + 50 * MS, t0 + 50 * MS + d),
                                          Span("load_weights", t0 + 8_500 * MS,
                                               t0 + 8_800 * MS)))


def step_data(step: int, ranks: int, engines: int, rng: np.random.Generator,
              ) -> tuple[list[StepMessage], list[RankTimeline], list[RankTimeline]]:
    world = World(dp=ranks)
    trainers = [RankTimeline(rank, trainer_timeline(step, i, rng))
                for i, rank in enumerate(world.ranks())]
    messages = []
    for seq, rt in enumerate(trainers):
        values = rng.random((N_METRICS, 3))
        values[:, 2] = 0.0
        messages.append(StepMessage("bench", "actor", step, rt.rank, world, step * ranks + seq,
                                    0.0, Columns(SCHEMA, values), timeline=rt.timeline))
    rollout = [RankTimeline(Rank(dp=i), engine_timeline(step, rng)) for i in range(engines)]
    return messages, trainers, rollout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--engines", type=int, default=64)
    parser.add_argument("--steps", type=int, default=7)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    core = AggregatorCore(deadline=DeadlinePolicy(fixed=600.0))
    spans = SpanMap()
    ledger = GoodputLedger()
    finalize, pure, hold, service = [], [], [], []
    for step in range(args.steps):
        messages, trainers, rollout = step_data(step, args.ranks, args.engines, rng)
        core.ingest(messages[:-1])
        t = time.perf_counter()
        ack = core.ingest(messages[-1:])
        finalize.append(time.perf_counter() - t)
        assert ack.finalized == 1
        (record,) = core.pending_records()
        core.delivered([record])
        assert len(record.timelines) == args.ranks
        roles = (RoleTimelines("actor", tuple(trainers)), RoleTimelines("rollout", tuple(rollout)))
        data = StepInput("bench", 0, step, roles, 0.2, 0.05)
        t = time.perf_counter()
        result = account_step(data, spans)
        pure.append(time.perf_counter() - t)
        assert result.ranks == {"actor": args.ranks, "rollout": args.engines}
        engines = StepRecord("bench", "rollout", step, True, args.engines, args.engines, (),
                             {catalog.FRAC_REWARD_ZERO_STD: 0.2, catalog.CLIPPED_RATIO: 0.05},
                             timelines=tuple(rollout))
        t = time.perf_counter()
        ledger.add(record)
        ledger.add(engines)
        hold.append(time.perf_counter() - t)
        t = time.perf_counter()
        ledger.account()
        service.append(time.perf_counter() - t)
    ledger.finish("bench")
    # the ledger lets a step go two steps later: its medians hold the accounting of one step
    fin, acc, add, svc = (statistics.median(x)
                          for x in (finalize, pure, hold, service[2:] or service))
    spans_per_step = sum(len(t.timeline.spans) for t in trainers) + 2 * args.engines
    print(f"machine: {platform.machine()}, {platform.processor() or platform.system()}, "
          f"Python {platform.python_version()}")
    print(f"one step: {args.ranks} trainer ranks x {N_METRICS} metrics, {spans_per_step} spans "
          f"(with nesting), {args.engines} rollout engines; median of {args.steps} steps")
    print(f"  aggregator finalization (baseline) {fin * 1e6:10.0f} us")
    print(f"  account_step                        {acc * 1e6:10.0f} us  "
          f"{acc / fin:6.2f}x the finalization")
    print(f"  service, alert path: ledger add     {add * 1e6:10.0f} us  "
          f"{add / fin:6.2f}x the finalization")
    print(f"  service, after alerts: account      {svc * 1e6:10.0f} us  "
          f"{svc / fin:6.2f}x the finalization")
    print(f"  per rank: {acc / (args.ranks + args.engines) * 1e6:.1f} us; on the training "
          f"path: 0 (the accounting runs in the service)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
