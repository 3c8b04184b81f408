"""Reporter cost per step for 200 metrics, against what users do today, measured in one run.

Figures (per step, 200 metrics, median over steps):
  * rlmon Reporter, scalars: training-thread time of 200 ``record`` + ``end_step``, alone (the
    sender thread idle) and in a tight loop (the sender thread packing and sending the previous
    steps, competing for the GIL); and whole-process CPU per step;
  * rlmon Reporter, batched scalars: the same 200 metrics in one ``record_many`` + ``end_step``
    (budget: <= 50 us on the training thread, whole process < 500 us);
  * rlmon Reporter, spans: a step of 7 nested spans (rollout > generate, reward; train >
    forward, backward; weight_sync) around the same ``record_many``: the training-thread time the
    timeline adds per step, against the same spans recording only their ``timing/*`` maximum (the
    Reporter before step timelines);
  * rlmon Reporter, tensors: 200 ``record_tensor`` (torch when installed, else numpy; 8
    micro-batches of 25 tensors sharing a mask) + ``end_step`` and the device-to-host transfers
    it took, against the same masked sums with ``.item()`` per metric in the same process, at
    torch's default intra-op threads and at one thread;
  * baseline A: torch.distributed all_reduce over gloo between 2 processes, one call per metric
    (OpenRLHF's pattern) and one batched call;
  * baseline B: prometheus_client gauges set directly (200 ``Gauge.labels(...).set``);
  * baseline C: ``rlwatch.log_step`` with the same 200 values.
Each baseline missing from this environment is reported as skipped.

Run: ``python bench/bench_reporter.py [--steps N]``. The Reporter's sink pickles each batch as
Ray would and acknowledges it, so the figures are the Reporter's own cost, without an actor call.
Wall-clock figures: on a shared machine (our 2-core boxes run other suites while this runs) they
move by up to 2x between runs, so run it a few times and compare rows within one run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from rlmon.actors.reporter import Reporter

N_METRICS = 200
NAMES = [f"bench/metric_{i:03d}" for i in range(N_METRICS)]


def _median_us(samples: list[float]) -> float:
    return statistics.median(samples) * 1e6


class PickleSink:
    """Serialises each batch as Ray would (pickle) and acknowledges it: the process's own share
    of sending, without an aggregator in the same process."""

    def send(self, messages: Any) -> None:
        import pickle

        pickle.dumps(list(messages), protocol=5)


def call_floor(steps: int) -> float:
    """200 calls of a no-op Python function with ``record``'s keyword signature."""

    def noop(name: str, *, sum: float | None = None, count: float | None = None,
             min: float | None = None, max: float | None = None) -> None:
        return None

    times = []
    for _ in range(steps):
        start = time.perf_counter()
        for i, name in enumerate(NAMES):
            noop(name, sum=float(i), count=4.0)
        times.append(time.perf_counter() - start)
    return _median_us(times)


def reporter_scalars(steps: int) -> dict[str, float]:
    rep = Reporter("bench", "actor", sink=PickleSink(), step_seconds=False)
    alone, tight = [], []
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for step in range(steps):
        start = time.perf_counter()
        for i, name in enumerate(NAMES):
            rep.record(name, sum=float(i), count=4.0)
        rep.end_step(step)
        alone.append(time.perf_counter() - start)
        rep.flush(10)  # not timed: the sender is idle when the next step starts
    cpu = (time.process_time() - cpu0) / steps
    del wall0
    for step in range(steps, 2 * steps):
        start = time.perf_counter()
        for i, name in enumerate(NAMES):
            rep.record(name, sum=float(i), count=4.0)
        rep.end_step(step)
        tight.append(time.perf_counter() - start)
    rep.flush(30)
    rep.close()
    return {"alone_us": _median_us(alone), "tight_us": _median_us(tight), "cpu_us": cpu * 1e6}


def reporter_many(steps: int) -> dict[str, float]:
    """200 metrics in one record_many + end_step; the mapping is what the caller already has."""
    rep = Reporter("bench", "actor", sink=PickleSink(), step_seconds=False)
    batch = {name: (float(i), 4.0) for i, name in enumerate(NAMES)}
    alone, tight = [], []
    cpu0 = time.process_time()
    for step in range(steps):
        start = time.perf_counter()
        rep.record_many(batch)
        rep.end_step(step)
        alone.append(time.perf_counter() - start)
        rep.flush(10)  # not timed: the sender is idle when the next step starts
    cpu = (time.process_time() - cpu0) / steps
    for step in range(steps, 2 * steps):
        start = time.perf_counter()
        rep.record_many(batch)
        rep.end_step(step)
        tight.append(time.perf_counter() - start)
    rep.flush(30)
    rep.close()
    return {"alone_us": _median_us(alone), "tight_us": _median_us(tight), "cpu_us": cpu * 1e6}


_PHASES = (("rollout", ("generate", "reward")), ("train", ("forward", "backward")),
           ("weight_sync", ()))


def _timing_only(rep: Reporter) -> Callable[[str], Any]:
    """``span`` as it was before step timelines: the ``timing/<name>_seconds`` maximum only."""
    import contextlib

    from rlmon.service.metrics.spec import Form

    @contextlib.contextmanager
    def span(name: str) -> Any:
        start = time.perf_counter()
        try:
            yield
        finally:
            rep._add(f"timing/{name}_seconds", Form.MAX, (time.perf_counter() - start,),
                     None, None, 0)

    return span


def reporter_spans(steps: int) -> dict[str, float]:
    """Training-thread time per step of record_many + end_step with 7 spans, with timelines
    (``Reporter.span``) and with timing-only spans, interleaved step by step."""
    batch = {name: (float(i), 4.0) for i, name in enumerate(NAMES)}
    out: dict[str, float] = {}
    reps = {"timeline": Reporter("bench", "actor", sink=PickleSink(), step_seconds=False)}
    reps["timing"] = Reporter("bench", "critic", sink=PickleSink(), step_seconds=False)
    spans = {"timeline": reps["timeline"].span, "timing": _timing_only(reps["timing"])}
    times: dict[str, list[float]] = {"timeline": [], "timing": []}
    for step in range(steps):
        for kind in ("timeline", "timing") if step % 2 else ("timing", "timeline"):
            rep, span = reps[kind], spans[kind]
            start = time.perf_counter()
            for outer, inner in _PHASES:
                with span(outer):
                    for name in inner:
                        with span(name):
                            pass
            rep.record_many(batch)
            rep.end_step(step)
            times[kind].append(time.perf_counter() - start)
            rep.flush(10)  # not timed
    for kind, rep in reps.items():
        rep.close()
        out[f"{kind}_us"] = _median_us(times[kind])
    return out


def reporter_tensors(steps: int, threads: int | None = None) -> dict[str, Any]:
    """``threads``: torch's intra-op threads for the run (None: torch's default)."""
    try:
        import torch

        default_threads = torch.get_num_threads()
        torch.set_num_threads(threads or default_threads)

        make: Callable[[], Any] = lambda: torch.rand(8, 256)  # noqa: E731
        mask_of: Callable[[Any], Any] = lambda v: v > 0.1  # noqa: E731
        kind = f"torch cpu, {torch.get_num_threads()} thread(s)"
    except ImportError:
        make = lambda: np.random.rand(8, 256)  # noqa: E731
        mask_of = lambda v: v > 0.1  # noqa: E731
        kind = "numpy"
    tensors = [make() for _ in range(N_METRICS)]
    shared = [mask_of(tensors[i]) for i in range(0, N_METRICS, 25)]  # one per micro-batch
    masks = [shared[i // 25] for i in range(N_METRICS)]
    rep = Reporter("bench", "actor", sink=PickleSink(), step_seconds=False)
    times, item_times = [], []
    for step in range(steps):
        start = time.perf_counter()
        for values, mask in zip(tensors, masks, strict=True):  # what frameworks do today
            _ = (float((values * mask).sum().item()), float(mask.sum().item()))
        item_times.append(time.perf_counter() - start)
        start = time.perf_counter()
        for name, values, mask in zip(NAMES, tensors, masks, strict=True):
            rep.record_tensor(name, values, mask)
        rep.end_step(step)
        times.append(time.perf_counter() - start)
        rep.flush(10)
    rep.close()
    if kind != "numpy":
        torch.set_num_threads(default_threads)
    return {"us": _median_us(times), "kind": kind, "transfers_per_step": rep.transfers / steps,
            "item_us": _median_us(item_times)}


def _gloo_worker(rank: int, port: int, steps: int, out: Any) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    values = [torch.tensor([float(i), 4.0]) for i in range(N_METRICS)]
    per_key, batched = [], []
    for _ in range(steps):
        dist.barrier()
        start = time.perf_counter()
        for v in values:
            dist.all_reduce(v)
        per_key.append(time.perf_counter() - start)
    flat = torch.zeros(N_METRICS * 2)
    for _ in range(steps):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(flat)
        batched.append(time.perf_counter() - start)
    if rank == 0:
        out.put((_median_us(per_key), _median_us(batched)))
    dist.destroy_process_group()


def gloo_all_reduce(steps: int) -> tuple[float, float] | None:
    try:
        import torch.multiprocessing as mp
    except ImportError:
        return None
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_gloo_worker, args=(r, port, steps, queue)) for r in range(2)]
    for p in procs:
        p.start()
    result: tuple[float, float] = queue.get(timeout=300)
    for p in procs:
        p.join(60)
    return result


def prometheus_gauges(steps: int) -> float:
    from prometheus_client import CollectorRegistry, Gauge

    registry = CollectorRegistry()
    gauges = [Gauge(name.replace("/", "_"), "bench", ["run", "role"], registry=registry)
              for name in NAMES]
    times = []
    for step in range(steps):
        start = time.perf_counter()
        for i, g in enumerate(gauges):
            g.labels(run="bench", role="actor").set(float(i) + step)
        times.append(time.perf_counter() - start)
    return _median_us(times)


def rlwatch_log_step(steps: int) -> float | None:
    try:
        import rlwatch
    except ImportError:
        return None
    import logging

    logging.getLogger("rlwatch").setLevel(logging.ERROR)
    cwd = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        try:
            monitor: Any = rlwatch.attach(framework="manual", run_id="bench", log_dir=tmp)
            values = {name.replace("/", "_"): float(i) for i, name in enumerate(NAMES)}
            times = []
            for step in range(steps):
                start = time.perf_counter()
                monitor.log_step(step, **values)
                times.append(time.perf_counter() - start)
            monitor.stop()
        finally:
            os.chdir(cwd)
    return _median_us(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args(argv)
    steps = args.steps
    floor = call_floor(steps)
    scalars = reporter_scalars(steps)
    many = reporter_many(steps)
    spans = reporter_spans(steps)
    tensors = reporter_tensors(max(steps // 3, 20))
    # One intra-op thread: on a shared 2-core machine a batched reduction large enough to be
    # split over threads waits for a core another process holds; per-metric ops are too small
    # to be split, so the comparison is fair only at one thread.
    single = reporter_tensors(max(steps // 3, 20), threads=1)
    gloo = gloo_all_reduce(max(steps // 3, 20))
    prom = prometheus_gauges(steps)
    rlw = rlwatch_log_step(max(steps // 3, 20))
    mine = scalars["alone_us"]
    print(f"Reporter cost per step, {N_METRICS} metrics (median; python {sys.version.split()[0]}, "
          f"{os.cpu_count()} cores)")
    rows: list[tuple[str, float | None]] = [
        ("rlmon Reporter, scalars: training thread", mine),
        ("rlmon Reporter, scalars: training thread, tight loop (GIL shared with sender)",
         scalars["tight_us"]),
        ("rlmon Reporter, scalars: whole process CPU", scalars["cpu_us"]),
        ("  (floor: 200 calls of a no-op function with that signature)", floor),
        ("rlmon Reporter, record_many: training thread", many["alone_us"]),
        ("rlmon Reporter, record_many: training thread, tight loop", many["tight_us"]),
        ("rlmon Reporter, record_many: whole process CPU", many["cpu_us"]),
        ("rlmon Reporter, record_many + 7 spans with timelines: training thread",
         spans["timeline_us"]),
        ("  (the same 7 spans recording only their timing/* maximum)", spans["timing_us"]),
        (f"rlmon Reporter, tensors ({tensors['kind']}): training thread", tensors["us"]),
        (f"  (same masked sums with {tensors['kind']} and .item() per metric)",
         tensors["item_us"]),
        (f"rlmon Reporter, tensors ({single['kind']}): training thread", single["us"]),
        (f"  (same masked sums with {single['kind']} and .item() per metric)",
         single["item_us"]),
        ("torch.distributed gloo all_reduce, one per metric (2 procs)", gloo[0] if gloo else None),
        ("torch.distributed gloo all_reduce, one batched (2 procs)", gloo[1] if gloo else None),
        ("prometheus_client Gauge.labels().set x200", prom),
        ("rlwatch log_step", rlw),
    ]
    for label, value in rows:
        if value is None:
            print(f"  {label:<82} skipped (not installed)")
        else:
            print(f"  {label:<82} {value:10.1f} us   x{value / mine:8.2f} of the Reporter")
    print(f"  tensor statistics: {tensors['transfers_per_step']:.0f} device-to-host transfer(s) "
          "per step (0 for numpy: already on the host)")
    budget = 100.0
    verdict = "meets" if mine <= budget else "misses"
    print(f"  budget: training thread <= {budget:.0f} us -> {verdict} ({mine:.1f} us); "
          f"whole process < 1000 us -> {'meets' if scalars['cpu_us'] < 1000 else 'misses'}")
    fast, cpu = max(many["alone_us"], many["tight_us"]), many["cpu_us"]
    print(f"  budget, record_many: training thread <= 50 us (alone and tight loop) -> "
          f"{'meets' if fast <= 50 else 'misses'} ({fast:.1f} us); whole process < 500 us -> "
          f"{'meets' if cpu < 500 else 'misses'} ({cpu:.1f} us)")
    added = spans["timeline_us"] - spans["timing_us"]
    print(f"  step timelines: 7 spans add {added:+.1f} us per step on the training thread over "
          f"timing-only spans ({added / 50 * 100:+.1f} % of the 50 us budget)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
