"""A run's stated state: "running", "slow", "stalled", "dead", "frozen", "failed", "preempted",
"finished", as the liveness tracker states it (what ``rlmon report``'s "Run state", the run
page and the liveness alerts say), against the state the generated run is really in.

Each seed is one run of ``bench/bench_liveness.py``'s simulation (2-8 ranks heartbeating every
5 s, their processes in a simulated process table the tracker's probe asks; a step period of 2,
20 or 120 s, the claims grid's), healthy for a warm-up, then, from a known moment, one of:
going on healthy, 10x slower steps, every rank hung in a stage, one rank hung while the rest
wait in a collective, half the ranks' node lost, the driver killed (every process gone, no
word), every process stopped (SIGSTOP: silent but alive), one rank's uncaught exception (the
rest then SIGTERMed or killed), every rank SIGTERMed from outside, a clean close. Scored: the
state stated at the end (right if it is the truth), the steps from the moment to the first time
the truth is stated, and, on a run that goes on healthy, any other state stated on the way."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from bench import bench_liveness as live
from bench.claims.cases import STEP_SECONDS
from bench.claims.registry import register
from bench.claims.score import Score
from rlmon.service.liveness.run_state import RunState

__all__ = ["run_state"]

TRUTH: dict[str, RunState] = {
    "healthy": RunState.RUNNING, "slow_10x": RunState.SLOW, "all_hang": RunState.STALLED,
    "one_rank_hang": RunState.STALLED, "node_lost": RunState.STALLED,
    "driver_killed": RunState.DEAD, "freeze_sigstop": RunState.FROZEN,
    "crash_exception": RunState.FAILED, "preempted_sigterm": RunState.PREEMPTED,
    "clean_finish": RunState.FINISHED}


@dataclass
class _Watched(live.Sim):
    """The simulated run, the tracker's stated state kept at every timer tick."""

    said: list[tuple[float, RunState]] = field(default_factory=list)

    def _evaluate(self, t: float) -> None:
        super()._evaluate(t)
        view = self.tracker.view(self.name, "actor", t)
        if view is not None:
            self.said.append((t, view.state))


def _case(seed: int, fast: bool) -> tuple[str, float, _Watched]:
    """(the case, the moment it set in, the run simulated to its horizon)."""
    rng = random.Random(seed)
    case = tuple(TRUTH)[seed % len(TRUTH)]
    period = STEP_SECONDS[(seed // len(TRUTH)) % len(STEP_SECONDS)]
    sim = _Watched(rng, f"{case}-{seed}", rng.randint(2, 8), period)
    sim.advance(live.T0 + max(1200.0, 30 * period))
    sim.advance(sim.now + sim.step_len * rng.uniform(0.1, 0.9))  # somewhere into a step
    onset = sim.now
    # long enough for the slowest claim: 10x slower steps, several of them
    horizon = onset + max(1800.0 if fast else 3600.0, 60 * period)
    ranks = range(sim.ranks)
    stage = sim.stage_at(onset)
    if case == "healthy":
        sim.advance(horizon)
    elif case == "slow_10x":
        sim.slow = 10.0
        sim.step_len *= 10.0
        sim.advance(horizon)
    elif case == "all_hang":
        sim.advance(horizon, steps=False, where=lambda dp, t: stage)
    elif case == "one_rank_hang":
        stuck = rng.randrange(sim.ranks)
        sim.advance(horizon, steps=False, where=lambda dp, t: stage if dp == stuck
                    else ("allreduce", onset))
    elif case == "node_lost":
        lost = set(range(sim.ranks // 2))
        sim.advance(horizon, steps=False, where=lambda dp, t: ("allreduce", onset),
                    alive=lambda dp: dp not in lost)
    elif case == "driver_killed":
        for dp in ranks:
            sim.procs[dp] = "gone"
        sim.advance(horizon, steps=False, alive=lambda dp: False)
    elif case == "freeze_sigstop":
        for dp in ranks:
            sim.procs[dp] = "stopped"
        sim.advance(horizon, steps=False)
    elif case == "crash_exception":
        crashed = rng.randrange(sim.ranks)
        sim.end(onset, [crashed], live.OOM)
        others = [dp for dp in ranks if dp != crashed]
        waited = onset + rng.uniform(5.0, 60.0)
        sim.advance(waited, steps=False, where=lambda dp, t: ("allreduce", onset))
        if rng.random() < 0.5:
            sim.end(waited, others, live.SIGTERM)
        else:
            for dp in others:
                sim.procs[dp] = "gone"
        sim.advance(horizon, steps=False)
    elif case == "preempted_sigterm":
        sim.end(onset, ranks, live.SIGTERM)
        sim.advance(horizon, steps=False)
    else:  # clean_finish
        sim._beat(onset, lambda dp, t: None, lambda dp: True, closing=True)
        sim.advance(horizon, steps=False, alive=lambda dp: False)
    return case, onset, sim


@register("run.state", "the run's state (running, slow, stalled, dead, frozen, failed, "
          "preempted, finished) at the end, against the state the generated run is in; delay: "
          "step periods from the moment it set in to the first time the truth is stated")
def run_state(seeds: Sequence[int], fast: bool) -> Score:
    score = Score("run.state")
    for seed in seeds:
        case, onset, sim = _case(seed, fast)
        truth = TRUTH[case]
        after = [(t, s) for t, s in sim.said if t >= onset]
        final = after[-1][1] if after else None
        first = next((t for t, s in after if s is truth), None)
        wrong_on_the_way = case == "healthy" and any(s is not truth for _, s in after)
        delay = None if first is None else math.ceil((first - onset) / sim.period)
        score.event(truth=True, said=final is not None,
                    right=final is truth and not wrong_on_the_way, delay=delay,
                    what=f"{sim.name} (period {sim.period:g} s): said "
                         f"{sorted({s.value for _, s in after})}, ended {final}, truth {truth}")
    return score
