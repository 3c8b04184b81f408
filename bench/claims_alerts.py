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

Register them as ``{"reward_hacking": claims_alerts.reward_hacking, "escalation":
claims_alerts.escalations, "healthy_quiet": claims_alerts.healthy_quiet}``; ``TUNING`` and
``HELD_OUT`` are the seeds used here.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
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

__all__ = ["CLAIMS", "HELD_OUT", "TUNING", "escalations", "healthy_quiet", "reward_hacking"]

TUNING: dict[str, range] = {"reward_hacking": range(0, 200), "escalation": range(0, 20),
                            "healthy_quiet": range(7000, 7003)}
HELD_OUT: dict[str, range] = {"reward_hacking": range(7000, 7100),
                              "escalation": range(9000, 9020),
                              "healthy_quiet": range(9100, 9105)}
WITHIN = 15  # steps after the onset a hack must be named in


def reward_hacking(seeds: range) -> dict[str, Any]:
    """Recall, delay and hold of ``RewardHacking`` per kind, and the healthy runs that fired."""
    rules = [reward_hacking_rule()]
    delays: dict[str, list[int | None]] = {}
    held: dict[str, list[float]] = {}
    false_alarms = Counter[str]()
    healthy_runs = Counter[str]()
    for case in bench_reward_hacking.cases(seeds):
        events = bench_reward_hacking.transitions(case, rules)
        fired = [step for _, step, state in events if state == "firing"]
        if case.kind in ("healthy", "detection-healthy", "length_runaway", "kl_blowup"):
            healthy_runs[case.kind] += 1
            false_alarms[case.kind] += bool(fired)
            continue
        kind = case.kind if case.kind.startswith("climb") else f"{case.kind}-{case.ramp}"
        after = [s - case.onset for s in fired if s >= case.onset]
        delays.setdefault(kind, []).append(after[0] if after else None)
        if case.kind.startswith("climb"):
            share = bench_reward_hacking.held_share(events, "RewardHacking",
                                                    bench_reward_hacking.STEPS)
            if share is not None:
                held.setdefault(kind, []).append(share)
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


def escalations(seeds: range) -> dict[str, Any]:
    """Per blow-up kind: the escalations whose quoted level and first step are right, those
    priced once, and (entropy) the collapses called critical."""
    out: dict[str, Any] = {}
    for metric, (alert, level) in _CRITICAL.items():
        right = priced_once = critical = cases = 0
        for seed in seeds:
            rows, _onset = _blow_up(seed, metric)
            run = LoggedRun(source="bench", format="hf-trainer-state", name=f"b{seed}",
                            rows=rows)
            d = diagnose(run, gpus=8, price=2.5)
            found = [f for f in d.findings if f.alert == alert and f.state == "firing"]
            cases += 1
            escalated = [f for f in found if f.escalated_from]
            if not escalated:
                continue
            critical += 1
            esc = escalated[0]
            priced_once += esc.cost is None and found[0].cost is not None
            if level is not None:
                first = min((s for s, v in rows.items() if v[metric] > level), default=None)
                right += (esc.since == first and f"> {level:g} (the critical level)"
                          in esc.condition)
            else:
                right += "below its own pre-onset level" in esc.condition
        out[alert] = {"cases": cases, "critical": critical / cases,
                      "quoted_right": right / cases, "priced_once": priced_once / cases}
    return out


def healthy_quiet(seeds: range, steps: int = 400) -> dict[str, Any]:
    """Warnings per 1,000 healthy steps and the most notifications of one condition in a run,
    per benign kind and over all."""
    per_kind: dict[str, Any] = {}
    warnings = total_steps = 0
    worst = 0
    for kind in bench_hard_negatives.KINDS:
        kind_warnings = kind_worst = 0
        for seed in seeds:
            result = replay(bench_hard_negatives.contract_lines(
                bench_hard_negatives.run_series(kind, seed, steps), f"{kind}-{seed}", 30.0))
            firings = [e for e in result.alerts if e.state == "firing" and not e.repeat]
            kind_warnings += len(firings)
            sent = Counter((e.role, e.alert) for e in result.alerts if e.notify)
            kind_worst = max([kind_worst, *sent.values()])
        per_kind[kind] = {"warnings_per_1000": 1000 * kind_warnings / (steps * len(seeds)),
                          "most_notifications_of_one_condition": kind_worst}
        warnings += kind_warnings
        total_steps += steps * len(seeds)
        worst = max(worst, kind_worst)
    return {"kinds": per_kind, "warnings_per_1000": 1000 * warnings / total_steps,
            "most_notifications_of_one_condition": worst, "healthy_steps": total_steps}


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
