"""The goodput scenario (:mod:`tests.support.goodput_scenario`) as a service stores it: records
per role over several steps, an alert with its cost and worst samples, and a restart."""

from __future__ import annotations

from pathlib import Path

from rlmon.service.config import GoodputConfig, Settings
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.metrics import catalog
from tests.support.goodput_scenario import CLIPPED, FRAC_ZERO_STD, step_input

__all__ = ["GOODPUT", "RUN", "WORST", "report_store", "step_records"]


RUN = "synthetic"
WORST = catalog.samples_for(catalog.IS_RATIO_MIN) or ""
GOODPUT = GoodputConfig(gpus_per_rank={"rollout": 2.0})  # the scenario's engines hold 2 GPUs


def step_records(step: int, attempt: int = 0, bad: bool = False) -> list[StepRecord]:
    """The scenario's step as the aggregator finalizes it: one record per role, the tied and
    truncated fractions from the reward worker and the engines, ``bad``: the trainer's lowest
    IS ratio under ISRatioStale's 0.1, with its worst sample."""
    data = step_input(step)
    end = max(t.timeline.end_ns for r in data.roles for t in r.timelines) * 1e-9
    out = []
    for rt in data.roles:
        metrics = {"rollout": {catalog.CLIPPED_RATIO: CLIPPED},
                   "reward": {catalog.FRAC_REWARD_ZERO_STD: FRAC_ZERO_STD,
                              catalog.REWARD: 0.1 * step},
                   "actor": {catalog.IS_RATIO_MIN: 0.05 if bad else 0.9,
                             catalog.IS_RATIO: 1.0}}[rt.role]
        samples = {WORST: ((0.05, f"seq-{step}", "a response the trainer finds unlikely"),)} if (
            rt.role == "actor") else {}
        out.append(StepRecord(RUN, rt.role, step, True, len(rt.timelines), len(rt.timelines),
                              (), metrics, finalized_at=end, attempt=attempt,
                              timelines=rt.timelines, samples=samples))
    return out


def report_store(state: Path) -> Path:
    """A service's state directory holding the scenario's steps 5-10, ISRatioStale firing at 7
    and resolving at 9, then a restart from step 9 (attempt 1, steps 9-11) where it fires again
    at 11 and is still firing at the end."""
    from rlmon.service.alerting.rules import default_rules
    from rlmon.service.service_core import ServiceCore

    # ISRatioStale firing at its first bad step and resolving at the first good one (no
    # persistence, no hysteresis): the scenario is short
    rules = [r.model_copy(update={"resolve_after": 1, "for_steps": 1})
             if r.name == "ISRatioStale" else r
             for r in default_rules()]
    core = ServiceCore(Settings.model_validate({"notifiers": {"console": {"enabled": False}},
                                                "goodput": GOODPUT.model_dump()}),
                       state_dir=state, rules=rules)
    try:
        for n in range(5, 11):
            core.publish(step_records(n, bad=n in (7, 8)))
        for n in range(9, 12):
            core.publish(step_records(n, attempt=1, bad=n == 11))
    finally:
        core.close()
    return state
