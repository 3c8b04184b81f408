"""Claims about alerts scored against known truth (issue 39): reward hacking, escalations and
quiet healthy runs. Functions for the claims benchmark's registry (``bench/bench_claims.py``),
runnable alone for their figures.

Each claim kind is a function ``(seeds) -> dict`` of figures, so the registry can call it on its
tuning seeds and on held-out ones and print both:

- :func:`reward_hacking`: ``RewardHacking`` on ``bench_reward_hacking.py``'s runs (a hack that
  jumps, ramps or climbs at a steady rate to the end; the verifier gap alone): recall, the delay
  from the onset (mean, max, share within 15 steps), the share of the steps from the first alert
  to the end of a never-fixed climb that it holds, and the healthy runs (reward and length
  growing together) that fired.
- :func:`escalations`: a KL or gradient blow-up (x1.1 to x1.3 a step, from a known step) and an
  entropy collapse, diagnosed from a ``trainer_state.json``-shaped log: each escalation quotes
  the critical level and the step it was first crossed (checked against the series), is priced
  once, and a collapse of more than 90 % of the entropy's own level is critical.
- :func:`healthy_quiet`: ``bench_hard_negatives.py``'s healthy runs with benign changes, through
  ``rlmon replay``: warnings per 1,000 healthy steps and the most notifications one condition
  sent in one run (targets: at most 1 and at most 3).

The claims benchmark scores them case by case (``bench/claims/kinds/alerts.py``: the
``*_cases`` / :func:`healthy_runs` generators); ``TUNING`` and ``HELD_OUT`` are the seeds used
when this file runs alone.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_hard_negatives  # the healthy runs with benign changes
import bench_reward_hacking  # the reward-hacking runs

from rlmon.service.alerting.rules import reward_hacking_rule
from rlmon.service.diagnose.findings import diagnose
from rlmon.service.diagnose.logged_run import LoggedRun
from rlmon.service.replay import replay

__all__ = ["CLAIMS", "HELD_OUT", "TUNING", "EscalationCase", "HackingCase", "HealthyRun",
           "escalation_cases", "escalations", "hacking_cases", "healthy_quiet", "healthy_runs",
           "per_1000", "reward_hacking"]

TUNING: dict[str, range] = {"reward_hacking": range(0, 200), "escalation": range(0, 20),
                            "healthy_quiet": range(7000, 7003)}
HELD_OUT: dict[str, range] = {"reward_hacking": range(7000, 7100),
                              "escalation": range(9000, 9020),
                              "healthy_quiet": range(9100, 9105)}
WITHIN = bench_reward_hacking.WITHIN  # steps after the onset a hack must be named in


@dataclass(frozen=True, slots=True)
class HackingCase:
    """One reward-hacking run: its kind, the steps from the onset to the first alert at or after
    it (None: none), the share of a steady climb's steps the alert held, whether it fired
    before the onset; on a healthy run (``hack`` False) whether it fired at all."""

    kind: str
    hack: bool
    delay: int | None = None
    held: float | None = None
    early: bool = False
    fired: bool = False


def hacking_cases(seeds: range) -> Iterator[HackingCase]:
    """``RewardHacking`` on each of ``bench_reward_hacking.py``'s runs of ``seeds``."""
    rules = [reward_hacking_rule()]
    for case in bench_reward_hacking.cases(seeds):
        events = bench_reward_hacking.transitions(case, rules)
        fired = [step for _, step, state in events if state == "firing"]
        if case.kind in ("healthy", "detection-healthy", "length_runaway", "kl_blowup"):
            yield HackingCase(case.kind, False, fired=bool(fired))
            continue
        kind = case.kind if case.kind.startswith("climb") else f"{case.kind}-{case.ramp}"
        after = [s - case.onset for s in fired if s >= case.onset]
        held = bench_reward_hacking.held_share(events, "RewardHacking",
                                               bench_reward_hacking.STEPS) \
            if case.kind.startswith("climb") else None
        yield HackingCase(kind, True, after[0] if after else None, held,
                          any(s < case.onset for s in fired), bool(fired))


def reward_hacking(seeds: range) -> dict[str, Any]:
    """Recall, delay and hold of ``RewardHacking`` per kind, and the healthy runs that fired."""
    delays: dict[str, list[int | None]] = {}
    held: dict[str, list[float]] = {}
    false_alarms = Counter[str]()
    healthy_runs = Counter[str]()
    for case in hacking_cases(seeds):
        if not case.hack:
            healthy_runs[case.kind] += 1
            false_alarms[case.kind] += case.fired
            continue
        delays.setdefault(case.kind, []).append(case.delay)
        if case.held is not None:
            held.setdefault(case.kind, []).append(case.held)
    out: dict[str, Any] = {}
    for kind, found in sorted(delays.items()):
        hit = [d for d in found if d is not None]
        out[kind] = {"cases": len(found), "recall": len(hit) / len(found),
                     "within_15": sum(d <= WITHIN for d in hit) / len(found),
                     "delay_mean": statistics.mean(hit) if hit else None,
                     "delay_max": max(hit) if hit else None}
        if kind in held:
            out[kind]["held_mean"] = statistics.mean(held[kind])
            out[kind]["held_min"] = min(held[kind])
    out["healthy"] = {kind: {"runs": n, "fired": false_alarms[kind]}
                      for kind, n in healthy_runs.items()}
    return out


def _blow_up(seed: int, metric: str) -> tuple[dict[int, dict[str, float]], int]:
    """A TRL-keyed log of 150 steps of 20 s where ``metric`` blows up from a known step."""
    rng = np.random.default_rng([seed, 39])
    onset = int(rng.integers(40, 70))
    rate = float(rng.uniform(1.1, 1.3))
    rows = {}
    for step in range(1, 151):
        k = max(0, step - onset)
        row = {"reward": 0.3 + 0.001 * step + 0.02 * rng.standard_normal(),
               "completions/mean_length": 300 * math.exp(0.02 * rng.standard_normal()),
               "kl": 0.02 * math.exp(0.03 * rng.standard_normal()),
               "grad_norm": math.exp(0.05 * rng.standard_normal()),
               "entropy": 0.45 * math.exp(0.02 * rng.standard_normal()),
               "step_time": 20.0}
        if metric == "entropy":
            row["entropy"] = max(0.0119, 0.45 * (2 - rate) ** k) \
                * math.exp(0.02 * rng.standard_normal())
        else:
            row[metric] *= rate ** k
        rows[step] = row
    return rows, onset


_CRITICAL = {"kl": ("KLDivergence", 10.0), "grad_norm": ("GradNormHigh", 1000.0),
             "entropy": ("EntropySliding", None)}


@dataclass(frozen=True, slots=True)
class EscalationCase:
    """One blow-up: whether its alert escalated, quoted the critical level and the step it was
    first crossed right, and was priced once."""

    alert: str
    escalated: bool
    quoted_right: bool = False
    priced_once: bool = False


def escalation_cases(seeds: range) -> Iterator[EscalationCase]:
    """A KL, gradient-norm and entropy blow-up per seed, diagnosed from a log."""
    for metric, (alert, level) in _CRITICAL.items():
        for seed in seeds:
            rows, _onset = _blow_up(seed, metric)
            run = LoggedRun(source="bench", format="hf-trainer-state", name=f"b{seed}",
                            rows=rows)
            d = diagnose(run, gpus=8, price=2.5)
            found = [f for f in d.findings if f.alert == alert and f.state == "firing"]
            escalated = [f for f in found if f.escalated_from]
            if not escalated:
                yield EscalationCase(alert, False)
                continue
            esc = escalated[0]
            if level is not None:
                first = min((s for s, v in rows.items() if v[metric] > level), default=None)
                right = esc.since == first and f"> {level:g} (the critical level)" \
                    in esc.condition
            else:
                right = "below its own pre-onset level" in esc.condition
            yield EscalationCase(alert, True, right,
                                 esc.cost is None and found[0].cost is not None)


def escalations(seeds: range) -> dict[str, Any]:
    """Per blow-up kind: the escalations whose quoted level and first step are right, those
    priced once, and (entropy) the collapses called critical."""
    by: dict[str, list[EscalationCase]] = {}
    for case in escalation_cases(seeds):
        by.setdefault(case.alert, []).append(case)
    return {alert: {"cases": len(cases),
                    "critical": sum(c.escalated for c in cases) / len(cases),
                    "quoted_right": sum(c.quoted_right for c in cases) / len(cases),
                    "priced_once": sum(c.priced_once for c in cases) / len(cases)}
            for alert, cases in by.items()}


@dataclass(frozen=True, slots=True)
class HealthyRun:
    """One healthy run with a benign change: its warnings (firings) and the most notifications
    one condition sent."""

    kind: str
    seed: int
    steps: int
    warnings: int
    worst: int


def healthy_runs(seeds: range | list[int], steps: int = 400,
                 kinds: tuple[str, ...] = ()) -> Iterator[HealthyRun]:
    """``bench_hard_negatives.py``'s runs of ``kinds`` (default: all) through ``rlmon
    replay``."""
    for kind in kinds or tuple(bench_hard_negatives.KINDS):
        for seed in seeds:
            result = replay(bench_hard_negatives.contract_lines(
                bench_hard_negatives.run_series(kind, seed, steps), f"{kind}-{seed}", 30.0))
            firings = [e for e in result.alerts if e.state == "firing" and not e.repeat]
            sent = Counter((e.role, e.alert) for e in result.alerts if e.notify)
            yield HealthyRun(kind, seed, steps, len(firings), max(sent.values(), default=0))


def healthy_quiet(seeds: range, steps: int = 400) -> dict[str, Any]:
    """Warnings per 1,000 healthy steps and the most notifications of one condition in a run,
    per benign kind and over all."""
    by: dict[str, list[HealthyRun]] = {}
    for run in healthy_runs(seeds, steps):
        by.setdefault(run.kind, []).append(run)
    runs = [r for rs in by.values() for r in rs]
    return {"kinds": {kind: {"warnings_per_1000": per_1000(rs),
                             "most_notifications_of_one_condition": max(r.worst for r in rs)}
                      for kind, rs in by.items()},
            "warnings_per_1000": per_1000(runs),
            "most_notifications_of_one_condition": max(r.worst for r in runs),
            "healthy_steps": sum(r.steps for r in runs)}


def per_1000(runs: list[HealthyRun]) -> float:
    """Warnings per 1,000 of the runs' steps."""
    return 1000 * sum(r.warnings for r in runs) / max(1, sum(r.steps for r in runs))


CLAIMS: dict[str, Callable[[range], dict[str, Any]]] = {
    "reward_hacking": reward_hacking, "escalation": escalations, "healthy_quiet": healthy_quiet}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--claims", default=",".join(CLAIMS))
    parser.add_argument("--seeds", choices=("held-out", "tuning"), default="held-out")
    args = parser.parse_args()
    table = HELD_OUT if args.seeds == "held-out" else TUNING
    for name in args.claims.split(","):
        started = time.perf_counter()
        figures = CLAIMS[name](table[name])
        print(json.dumps({"claim": name, "seeds": f"{table[name].start}-{table[name].stop - 1}",
                          "seconds": round(time.perf_counter() - started, 1), **figures}),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
