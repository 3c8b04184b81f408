"""What per-token statistics add to a training step, on whatever device is present (issue 13).

A training-like step: 8 micro-batches, each some matmul work and 25 masked per-token statistics
(200 per step). Four ways of reporting them, interleaved step by step in one run:
  * none: the step without metrics;
  * item: masked mean + ``.item()`` per metric (200 host syncs a step);
  * fused: hand-fused ideal: per micro-batch one stacked masked sum into a preallocated device
    buffer, one copy a step;
  * rlmon: ``record_tensor`` x200 + ``end_step`` (the sink drops what it is sent);
  * rlmon+samples: the same plus worst-sample capture on the device path, two sample metrics per
    micro-batch (``record_sample_tensor``: per-sequence mean and min scores, a stable sort, the
    best 8 joining the step's one copy, payload text built for the selected only).
A light step (~5 ms of work) and a heavy one (~80 ms). On CPU the figures are CPU figures; the
GPU targets (light <= 1 ms overhead, heavy <= 2 %) need a GPU run, which this prints as not
measured when none is present. Also counts the ATen operations rlmon dispatches per call.

On CPU the work and the metric calls run one after the other, so the time inside the metric calls
is the overhead, read two ways: wall time, and the training thread's CPU time. On a shared,
loaded machine (our 2-core boxes run other suites) wall time also holds the waits for a core
another process holds, which fall at random on any variant; CPU time does not, so the two together
tell a real difference from the machine's noise. The Reporter's sender thread reads the copy,
merges and packs each step off the training thread: its CPU per rlmon step is measured apart and
printed too (the whole process's cost is the training thread's CPU in the calls plus that). Run
it a few times; take the medians.

Run: ``python bench/bench_tensor_gpu.py [--steps N] [--threads 1]`` (needs torch; skipped
without it). On a 2-core machine pass ``--threads 1``: with torch's default two threads a batched
reduction is split over both cores and then waits for the one another process holds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

MICRO_BATCHES, PER_MASK = 8, 25
BATCH, TOKENS = 4, 256


class DropSink:
    """Acknowledges nothing and keeps nothing: the Reporter's own cost only."""

    def send(self, messages: Any) -> None:
        return None


def _sync(torch: Any, device: Any) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


WIDTH = 256


def _calibrate(torch: Any, device: Any, target_s: float) -> tuple[Any, int]:
    """A square weight and how many matmuls per micro-batch make a step of about target_s."""
    w = torch.randn(WIDTH, WIDTH, device=device) / WIDTH**0.5
    x = torch.randn(BATCH * 16, WIDTH, device=device)
    samples = []
    for _ in range(15):
        _sync(torch, device)
        start = time.perf_counter()
        for _ in range(10):
            torch.tanh(x @ w)
        _sync(torch, device)
        samples.append((time.perf_counter() - start) / 10)
    one = statistics.median(samples)
    return w, max(1, round(target_s / MICRO_BATCHES / one))


def run(steps: int, threads: int | None = None) -> int:
    try:
        import torch
    except ImportError:
        print("bench_tensor_gpu: skipped (torch is not installed in this environment; "
              "run it with the extras venv: .venv-extras/bin/python bench/bench_tensor_gpu.py)")
        return 0
    from torch.utils._python_dispatch import TorchDispatchMode

    from rlmon.actors.reporter import Reporter

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if threads:
        torch.set_num_threads(threads)
    what = torch.cuda.get_device_name(device) if device.type == "cuda" else \
        f"CPU, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads"
    gen = torch.Generator().manual_seed(0)
    masks = [(torch.rand(BATCH, TOKENS, generator=gen) > 0.2).to(device)
             for _ in range(MICRO_BATCHES)]
    names = [f"bench/stat_{i:02d}" for i in range(PER_MASK)]
    rep = Reporter("bench", "actor", rank={"dp": 0}, world={"dp": 1}, sink=DropSink(),
                   step_seconds=False)
    buffer = torch.zeros(MICRO_BATCHES * PER_MASK * 2, dtype=torch.float64, device=device)

    shapes = torch.randn(PER_MASK, BATCH, TOKENS, generator=gen).to(device)

    def micro_batch(w: Any, reps: int) -> Any:
        x = torch.randn(BATCH * 16, WIDTH, device=device)
        for _ in range(reps):
            x = torch.tanh(x @ w)
        # 25 per-token statistics, as a loss / entropy / KL computation leaves them
        per_token = shapes * x[0, 0]
        return [per_token[j] for j in range(PER_MASK)]

    def none(stats: list[Any], mask: Any, mb: int) -> None:
        return None

    def item(stats: list[Any], mask: Any, mb: int) -> None:
        for v in stats:
            ((v * mask).sum() / mask.sum()).item()

    def fused(stats: list[Any], mask: Any, mb: int) -> None:
        at = mb * PER_MASK * 2
        sums = torch.where(mask, torch.stack(stats), 0).sum((1, 2), dtype=torch.float64)
        buffer[at:at + PER_MASK] += sums
        buffer[at + PER_MASK:at + 2 * PER_MASK] += mask.sum(dtype=torch.float64)

    def rlmon(stats: list[Any], mask: Any, mb: int) -> None:
        for name, v in zip(names, stats, strict=True):
            rep.record_tensor(name, v, mask)

    texts = [f"prompt and response of sequence {i}" for i in range(BATCH)]

    def rlmon_samples(stats: list[Any], mask: Any, mb: int) -> None:
        rlmon(stats, mask, mb)
        rep.record_sample_tensor("bench/worst", stats[0], mask, score="mean",
                                 payload=texts.__getitem__)
        rep.record_sample_tensor("bench/lowest", stats[1], mask, score="min", largest=False,
                                 payload=texts.__getitem__)

    def end(kind: str, step: int) -> None:
        if kind == "fused":
            buffer.tolist()
            buffer.zero_()
        elif kind.startswith("rlmon"):
            rep.end_step(step)

    variants: dict[str, Callable[[list[Any], Any, int], None]] = {
        "none": none, "item": item, "fused": fused, "rlmon": rlmon,
        "rlmon+samples": rlmon_samples}
    print(f"Per-step cost of 200 masked per-token statistics (8 micro-batches x 25), on {what}; "
          f"torch {torch.__version__}")
    step_no = 0
    results: dict[str, dict[str, float]] = {}
    for label, target_s, n in (("light", 0.005, steps), ("heavy", 0.08, max(steps // 8, 5))):
        w, reps = _calibrate(torch, device, target_s)
        times: dict[str, list[float]] = {k: [] for k in variants}
        inside: dict[str, list[float]] = {k: [] for k in variants}  # in the metric calls
        cpu: dict[str, list[float]] = {k: [] for k in variants}  # training thread CPU, in them
        began, rounds = time.perf_counter(), 0
        # two warm-up rounds; at most ~15 s a step kind on a loaded machine
        while rounds < n + 2 and (rounds < 5 or time.perf_counter() - began < 15):
            for kind, record in variants.items():
                _sync(torch, device)
                start = time.perf_counter()
                spent = used = 0.0
                for mb, mask in enumerate(masks):
                    stats = micro_batch(w, reps)
                    t0, c0 = time.perf_counter(), time.thread_time()
                    record(stats, mask, mb)
                    spent += time.perf_counter() - t0
                    used += time.thread_time() - c0
                t0, c0 = time.perf_counter(), time.thread_time()
                end(kind, step_no)
                spent += time.perf_counter() - t0
                used += time.thread_time() - c0
                _sync(torch, device)
                if rounds >= 2:
                    times[kind].append(time.perf_counter() - start)
                    inside[kind].append(spent)
                    cpu[kind].append(used)
                step_no += 1
            rounds += 1
        med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        calls = {k: statistics.median(v) * 1e3 for k, v in inside.items()}
        used_ms = {k: statistics.median(v) * 1e3 for k, v in cpu.items()}
        results[label] = calls if device.type == "cpu" else med
        results[label + " cpu"] = used_ms
        base = med["none"]
        print(f"  {label} step: {base:8.2f} ms without metrics ({rounds - 2} steps, median)")
        print(f"    {'':<56} {'step - none':>12} {'in metric calls':>16} {'thread CPU':>11}")
        for kind, text in (("item", "masked mean + .item() per metric (200 syncs)"),
                           ("fused", "hand-fused: one stacked sum per micro-batch, one copy"),
                           ("rlmon", "rlmon record_tensor x200 + end_step (1 copy)"),
                           ("rlmon+samples", "... + 16 sample captures (2 per micro-batch)")):
            extra = med[kind] - base
            print(f"    {text:<56} {extra:+9.3f} ms {calls[kind]:13.3f} ms {used_ms[kind]:8.3f} ms"
                  f"   ({100 * extra / base:+6.1f} % of the step)")
    rep.close(1.0)

    # Structural: ATen operations dispatched by rlmon per record_tensor call, over a step.
    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                               kwargs: Any = None) -> Any:
            Count.n += 1
            return func(*args, **(kwargs or {}))

    counting = Reporter("bench", "actor", rank={"dp": 0}, world={"dp": 1}, sink=DropSink(),
                        step_seconds=False)
    w, _ = _calibrate(torch, device, 0.001)
    data = [(micro_batch(w, 1), mask) for mask in masks]
    with Count():
        for stats, mask in data:
            for name, v in zip(names, stats, strict=True):
                counting.record_tensor(name, v, mask)
        counting.end_step(0)
    per_call = Count.n / (MICRO_BATCHES * PER_MASK)
    # The sender thread's CPU per rlmon step (reading the copy, merging, packing: off the
    # training thread), measured apart: a Reporter of its own, flushed after each step.
    alone = Reporter("bench", "actor", rank={"dp": 0}, world={"dp": 1}, sink=DropSink(),
                     step_seconds=False)
    clock = time.pthread_getcpuclockid(alone._thread.ident)  # type: ignore[arg-type]
    sender_cpu = []
    for step in range(40):
        for stats, mask in data:
            for name, v in zip(names, stats, strict=True):
                alone.record_tensor(name, v, mask)
        before = time.clock_gettime(clock)
        alone.end_step(step)
        alone.flush(10)
        sender_cpu.append(time.clock_gettime(clock) - before)
    alone.close(1.0)
    sender = statistics.median(sender_cpu[5:]) * 1e3
    Count.n = 0
    with Count():
        counting.record_sample_tensor("bench/worst", data[0][0][0], masks[0], score="mean")
    sample_ops = Count.n
    counting.end_step(1)
    counting.close(1.0)
    # On CPU the work and the metric calls run one after the other: the time inside the calls
    # is the overhead, without the noise of the work. On a GPU only the step difference counts.
    light = results["light"]
    rl, it, fu = (light[k] - light["none"] for k in ("rlmon", "item", "fused"))
    capture = (light["rlmon+samples"] - light["rlmon"]) / (2 * MICRO_BATCHES)
    where = "time in the calls" if device.type == "cpu" else "step time"
    print(f"  worst-sample capture on the device path: {capture * 1e3:.0f} us per "
          f"record_sample_tensor (light step, {where}), {sample_ops} ATen ops each, no sync")
    print(f"  ATen ops dispatched by rlmon per record_tensor, amortised over the step: "
          f"{per_call:.2f} (budget <= 1.5) -> {'meets' if per_call <= 1.5 else 'misses'}")
    if device.type == "cpu":
        light_cpu = results["light cpu"]
        c_rl, c_it = (light_cpu[k] - light_cpu["none"] for k in ("rlmon", "item"))
        whole = c_rl + sender
        print(f"  CPU target: rlmon no slower than .item() per metric (time in the metric calls, "
              f"light step) -> {'meets' if rl <= it else 'misses'} ({rl:.3f} vs {it:.3f} ms, "
              f"x{rl / it if it > 0 else 0:.2f}; hand-fused {fu:.3f} ms); training thread CPU "
              f"x{c_rl / c_it if c_it > 0 else 0:.2f} of .item() ({c_rl:.3f} vs {c_it:.3f} ms); "
              f"with the sender thread's {sender:.3f} ms a step, whole process "
              f"x{whole / c_it if c_it > 0 else 0:.2f}")
        print("  GPU targets (light <= 1 ms, within 5x of hand-fused, >= 10x below .item(); "
              "heavy <= 2 %): not measured here (no GPU on this machine)")
    else:
        heavy = results["heavy"]
        pct = 100 * (heavy["rlmon"] - heavy["none"]) / heavy["none"]
        print(f"  GPU targets: light {rl:+.3f} ms (<= 1 ms), x{rl / fu if fu > 0 else 0:.1f} of "
              f"hand-fused (<= 5), .item() / rlmon = x{it / rl if rl > 0 else 0:.1f} (>= 10); "
              f"heavy {pct:+.2f} % (<= 2 %)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads on CPU (default: torch's)")
    args = parser.parse_args(argv)
    return run(args.steps, args.threads)


if __name__ == "__main__":
    sys.exit(main())
