"""``rlmon diff``'s sentences: "runs part ways at step S (first diverging metric: M)" against
the step a fault began and the metric it moved; "no divergence ..." on equal runs: two seeds of
one config, the same numbers in two formats, two machines' host telemetry. A run is held in
memory, written in a format and read back, or published to a history store and read back as
the run page's diff reads it (the live path)."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from bench.claims.cases import fault_spec
from bench.claims.formats import read, write
from bench.claims.registry import register
from bench.claims.runs import CANONICAL, GeneratedRun, generate, records
from bench.claims.score import Score
from rlmon.service.diff import DiffResult, RunSeries, diff_runs
from rlmon.service.diff.runs import from_logged, from_step_lines
from rlmon.service.metrics import catalog as c
from rlmon.service.storage.history import HistoryStore

__all__ = ["in_memory", "parting", "parting_big", "silence"]

_ORDER = ("tensorboard", "trainer-state", "rlmon-jsonl", "history-store")


def in_memory(run: GeneratedRun) -> RunSeries:
    """The run as ``rlmon diff`` holds it, without a file (the catalog's names)."""
    series: dict[str, dict[int, float]] = {}
    for step, values in run.rows.items():
        for key, value in values.items():
            series.setdefault(CANONICAL.get(key, key), {})[step] = value
    return RunSeries(run.name, run.name, "generated", "generated", series)


def _stored(run: GeneratedRun, tag: str) -> RunSeries:
    """The run published to a history store and read back as the run page's diff reads it."""
    store = HistoryStore(":memory:")
    try:
        store.add(records(run))
        return from_step_lines(store.steps(run.name), tag, "history store")
    finally:
        store.close()


def _series(run: GeneratedRun, fmt: str, directory: Path, tag: str) -> RunSeries:
    if fmt == "history-store":
        return _stored(run, tag)
    return from_logged(read(write(run, fmt, directory / tag)), tag)


def _diff(a: GeneratedRun, b: GeneratedRun, formats: tuple[str, str] | None,
          directory: Path) -> DiffResult:
    if formats is None:
        return diff_runs(in_memory(a), in_memory(b))
    return diff_runs(_series(a, formats[0], directory, "a"), _series(b, formats[1], directory, "b"))


def _parting(seeds: Sequence[int], fast: bool, big: bool) -> Score:
    score = Score("diff.parting" + (".10x" if big else ""))
    with tempfile.TemporaryDirectory() as tmp:
        for seed in seeds:
            magnitudes = (10.0, 100.0, 1e3, 1e6) if big else (2.0, 5.0, 10.0, 100.0, 1e6)
            spec = fault_spec(seed, ("jump", "blowup", "nan"),
                              ("kl", "entropy", "grad_norm", "completions/mean_length"),
                              magnitudes, fast)
            b = generate(spec)
            a = generate(replace(spec.healthy(), seed=2 * seed))
            formats = None if fast or seed % 3 else (_ORDER[seed % 4], _ORDER[(seed // 3) % 4])
            if spec.fault == "nan" and formats is not None:
                formats = ("tensorboard", "trainer-state")  # JSON lines carry no NaN
            result = _diff(a, b, formats, Path(tmp) / str(seed))
            first = result.first
            want = {c.GRAD_NORM, c.LOSS} if spec.fault == "nan" else {CANONICAL[spec.metric]}
            said = first is not None and first.onset is not None
            delay = (first.onset - spec.onset) if said and first and first.onset is not None \
                else None
            late = 5 if big else 15
            right = said and first is not None and first.metric in want and delay is not None \
                and -2 <= delay <= late
            score.event(truth=True, said=said, right=right, delay=delay,
                        what=f"{b.name}: {result.headline()}")
    return score


@register("diff.parting", "runs part ways at step S (first diverging metric: M): the fault's "
          "metric, from 2 steps before its onset to 15 after, faults of 2x to 10^6x")
def parting(seeds: Sequence[int], fast: bool) -> Score:
    return _parting(seeds, fast, big=False)


@register("diff.parting.10x", "the same for departures of 10x or more: within 5 steps of onset")
def parting_big(seeds: Sequence[int], fast: bool) -> Score:
    return _parting(seeds, fast, big=True)


@register("diff.silence", "no divergence beyond the runs' own noise: two seeds of one config, "
          "the same numbers in two formats, two machines' host telemetry")
def silence(seeds: Sequence[int], fast: bool) -> Score:
    score = Score("diff.silence")
    pairs = (("tensorboard", "trainer-state"), ("trainer-state", "rlmon-jsonl"),
             ("tensorboard", "history-store"), ("history-store", "trainer-state"))
    with tempfile.TemporaryDirectory() as tmp:
        for seed in seeds:
            spec = replace(fault_spec(seed, ("jump",), ("kl",), fast=fast).healthy(),
                           telemetry=True)
            a = generate(spec)
            other_seed = generate(replace(spec, seed=2 * seed))
            cases = [("other seed", other_seed, None)]
            if not fast or seed % 4 == 0:
                cases.append(("same numbers, other format", a, pairs[seed % 4]))
            if not fast and seed % 10 == 0:
                cases.append(("same numbers, W&B offline", a, ("wandb-offline", "tensorboard")))
            for what, b, formats in cases:
                result = _diff(a, b, formats, Path(tmp) / f"{seed}-{len(what)}")
                score.event(truth=False, said=result.diverged, right=False,
                            what=f"{a.name} vs {what} {formats or ''}: {result.headline()}")
    return score

