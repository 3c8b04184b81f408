"""``diagnose``'s findings: "ALERT at step S" against the fault's onset (the fault's own alert,
read from each format's file), whether it holds while the fault holds (no "resolved" while a
lasting fault goes on), and its cost against the run's total."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from bench.claims.cases import fault_spec
from bench.claims.formats import read, write
from bench.claims.registry import register
from bench.claims.runs import RunSpec, generate
from bench.claims.score import Score
from rlmon.service.diagnose.findings import Diagnosis, diagnose

__all__ = ["cost_within_total", "finding_holds", "finding_step"]

# fault -> the alert (fixed level rules) it must raise: entropy divided by >= 100 falls under
# EntropyCollapse's 0.01; KL times >= 100 over KLDivergence's 2; NaN is NonFiniteMetric
_EXPECTED = {"entropy": "EntropyCollapse", "kl": "KLDivergence", "nan": "NonFiniteMetric"}
_FORMATS = ("trainer-state", "tensorboard", "rlmon-jsonl")


def _spec(seed: int, fast: bool) -> RunSpec:
    spec = fault_spec(seed, ("jump", "blowup", "nan"), ("entropy", "kl"), (1e3, 1e6), fast)
    return replace(spec, ramp=min(spec.ramp, 10))


def _diagnosed(spec: RunSpec, seed: int, tmp: Path, fast: bool) -> tuple[Diagnosis, str]:
    fmt = "trainer-state" if fast else _FORMATS[seed % (2 if spec.fault == "nan" else 3)]
    run = read(write(generate(spec), fmt, tmp / str(seed)))
    return diagnose(run, gpus=8, price=2.5), fmt


def _expected(spec: RunSpec) -> str:
    return _EXPECTED["nan" if spec.fault == "nan" else spec.metric]


@register("finding.step", "diagnose: ALERT at step S, the fault's own alert, S from its onset "
          "to 15 steps after (and nothing on a healthy twin)")
def finding_step(seeds: Sequence[int], fast: bool) -> Score:
    score = Score("finding.step")
    with tempfile.TemporaryDirectory() as tmp:
        for seed in seeds:
            spec = _spec(seed, fast)
            d, fmt = _diagnosed(spec, seed, Path(tmp), fast)
            want = _expected(spec)
            steps = [f.step for f in d.findings if f.state == "firing" and f.alert == want]
            delay = steps[0] - spec.onset if steps else None
            score.event(truth=True, said=bool(steps), right=delay is not None
                        and 0 <= delay <= 15, delay=delay,
                        what=f"{spec} ({fmt}): {want} at {steps[:1]}")
            if seed % 2 == 0:  # the healthy twin: its fixed level rules say nothing
                healthy, _ = _diagnosed(spec.healthy(), seed + 10**6, Path(tmp), fast)
                fired = [f.alert for f in healthy.findings if f.state == "firing"
                         and f.alert in _EXPECTED.values()]
                score.event(truth=False, said=bool(fired), right=False,
                            what=f"healthy {spec.config}: {fired}")
    return score


@register("finding.holds", "a firing finding is not resolved while its lasting fault goes on")
def finding_holds(seeds: Sequence[int], fast: bool) -> Score:
    score = Score("finding.holds")
    with tempfile.TemporaryDirectory() as tmp:
        for seed in seeds:
            spec = _spec(seed, fast)
            d, fmt = _diagnosed(spec, seed, Path(tmp), fast)
            want = _expected(spec)
            states = [(f.step, f.state) for f in d.findings if f.alert == want
                      and f.state in ("firing", "resolved")]
            if not states:
                continue
            resolved = [s for s, state in states if state == "resolved"]
            score.event(truth=True, said=True, right=not resolved,
                        what=f"{spec} ({fmt}): {want} {states}")
    return score


@register("cost.total", "the findings' GPU-hours add up to no more than the run's")
def cost_within_total(seeds: Sequence[int], fast: bool) -> Score:
    score = Score("cost.total")
    with tempfile.TemporaryDirectory() as tmp:
        for seed in seeds:
            spec = replace(_spec(seed, fast), seed=seed)
            d, fmt = _diagnosed(spec, seed, Path(tmp), True)  # the trainer state has step times
            priced = [f.cost.gpu_hours for f in d.findings if f.cost is not None
                      and f.cost.gpu_hours is not None]
            clock = d.clock
            total = clock.gpu_hours(clock.total_seconds) if clock is not None else None
            if total is None:
                score.event(truth=True, said=False, right=False, what=f"{spec}: no clock")
                continue
            spent = sum(priced)
            score.event(truth=True, said=bool(priced), right=spent <= total * (1 + 1e-9),
                        what=f"{spec} ({fmt}): findings {spent:.3g} of {total:.3g} GPU-hours")
    return score
