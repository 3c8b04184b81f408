"""Projections' sentences: "M reaches L in about S steps (90% range E-F steps ...)" while an
alert holds (the live engine's firing detail, or its heading stated anew after the firing:
:mod:`rlmon.service.alerting.heading`) and at the end of a log (``diagnose``'s "heading"),
against the step the logged metric really reaches the level; silence on a series that is flat,
has levelled off or recedes."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace

from bench.claims.cases import fault_spec
from bench.claims.registry import register
from bench.claims.runs import CANONICAL, DOWN, GeneratedRun, crossing, generate, records
from bench.claims.score import Score
from rlmon.service.alerting.engine import AlertEngine
from rlmon.service.alerting.projection import targets
from rlmon.service.alerting.rules import default_rules
from rlmon.service.diagnose.course import projections

__all__ = ["at_alert", "at_end", "silent_when_flat"]

# (rlmon before issue 39 wrote "(90%: E-F, from N recent values)": read too, to compare)
_RANGE = re.compile(r"(\S+) reaches .*? \(([-0-9.e+]+)\) in about [0-9.]+ steps "
                    r"\(90%(?: range |: )([0-9.]+)-([0-9.]+)")
# the faults that head for a level the rules page at: entropy down to 0.01, KL up to 2, the
# gradient norm up to 10 (magnitudes large enough to get there)
_HEADING = ("entropy", "kl", "grad_norm")
_EARLY = frozenset({"EntropySliding", "KLClimbing", "GradNormBlowingUp"})  # they project


def _heading_run(seed: int, fast: bool) -> GeneratedRun:
    spec = fault_spec(seed, ("blowup",), _HEADING, (1e3, 1e4, 1e6), fast)
    return generate(replace(spec, onset=min(spec.onset, spec.steps // 3),
                            ramp=spec.ramp + 20, steps=max(spec.steps, 150)))


@register("projection.alert", "while an alert holds: M reaches L in about S steps (90% range "
          "E-F steps), stated as it fires or refreshed after, against the step the logged "
          "value reaches L")
def at_alert(seeds: Sequence[int], fast: bool) -> Score:
    score = Score("projection.alert")
    for seed in seeds:
        run = _heading_run(seed, fast)
        engine = AlertEngine(default_rules())
        watched = CANONICAL[run.spec.metric]
        alert, fired, said, said_at, over = "", 0, None, 0, False
        for record in records(run):
            for e in engine.evaluate(record):
                if e.metric != watched or e.alert not in _EARLY:
                    continue
                if not alert and e.state == "firing" and not e.repeat:
                    alert, fired = e.alert, record.step
                if e.alert != alert:
                    continue
                over = over or e.state == "resolved"
                if said is None and not over:
                    said, said_at = _RANGE.search(e.detail), record.step
            if said is not None or over:
                break
        if alert:
            _score_range(score, run, said, said_at if said is not None else fired,
                         delay=said_at - fired if said is not None else None)
    return score


def _score_range(score: Score, run: GeneratedRun, match: re.Match[str] | None,
                 step: int, delay: int | None = None) -> None:
    """``match``: the range stated at ``step`` (``delay`` steps after the alert fired)."""
    key = run.spec.metric
    level = targets(default_rules())[CANONICAL[key]][0].level
    if crossing(run, key, level, key in DOWN, step - 1) == step:
        return  # there already as it fires: nothing to project (the level rule speaks)
    reached = crossing(run, key, level, key in DOWN, step)
    score.event(truth=reached is not None, said=match is not None,
                right=match is not None and reached is not None, delay=delay,
                what=f"{run.name} alert at {step}: " + ("silent" if match is None else ""))
    if match is None:
        return
    low, high = float(match.group(3)), float(match.group(4))
    last = max(run.rows)
    if reached is None and high >= last - step:
        return  # the range reaches past the log's end and the level was not seen: unscored
    truth = (reached - step) if reached is not None else float(last - step + 1)
    score.range(low=low, high=high, truth=truth, what=f"{run.name} at step {step}")


@register("projection.end", "at the end of a log: heading: M reaches L in about S steps (90% "
          "range E-F steps), against the step it reaches L after the log's end")
def at_end(seeds: Sequence[int], fast: bool) -> Score:
    score = Score("projection.end")
    rules = default_rules()
    for seed in seeds:
        run = _heading_run(seed, fast)
        spec = run.spec
        key = spec.metric
        level = targets(rules)[CANONICAL[key]][0].level
        reached = crossing(run, key, level, key in DOWN, spec.onset)
        if reached is None or reached - spec.onset < 12:
            continue  # never there, or there before a log cut on the way could show the way
        cut = spec.onset + 6 + seed % (reached - spec.onset - 6)  # somewhere on the way
        found = [p for p in projections(records(run, cut), rules)
                 if p.target.metric == CANONICAL[key]]
        score.event(truth=reached is not None, said=bool(found), right=bool(found),
                    what=f"{run.name} cut at {cut}: {found[0].describe() if found else 'silent'}")
        if found and reached is not None:
            p = found[0]
            score.range(low=p.earliest, high=p.latest, truth=reached - cut,
                        what=f"{run.name} cut at {cut}")
    return score


@register("projection.silence", "nothing projected for a series that is flat, levelled off "
          "after a rise, or recedes from its level")
def silent_when_flat(seeds: Sequence[int], fast: bool) -> Score:
    score = Score("projection.silence")
    rules = default_rules()
    for seed in seeds:
        spec = fault_spec(seed, ("blowup",), ("kl", "grad_norm"), (3.0, 5.0), fast)
        kind = seed % 3
        if kind == 0:
            spec = spec.healthy()  # flat (or slowly drifting) all along
        elif kind == 1:  # rose by 3-5x and levelled off 35 steps before the end
            spec = replace(spec, steps=max(spec.steps, 120), onset=20, ramp=15)
            spec = replace(spec, steps=spec.onset + spec.ramp + 35)
        else:  # moving away from the level
            spec = replace(spec, metric="entropy" if spec.metric != "entropy" else "kl",
                           magnitude=1 / spec.magnitude)
        run = generate(spec)
        found = [p for p in projections(records(run), rules)
                 if p.target.metric == CANONICAL[spec.metric]]
        score.event(truth=False, said=bool(found), right=False,
                    what=f"{run.name}: {found[0].describe() if found else ''}")
    return score
