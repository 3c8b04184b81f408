"""The stop switch on a real TRL run: a GRPOTrainer (CPU, the tiny local model) whose reward
breaks partway through fires a rule with the stop action, and the trainer stops itself long
before ``max_steps``. The service, the aggregator and the Reporter run in this process
(tests/stop_support.py), so the decision travels the same acks as on Ray."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rlmon.actors.reporter import Reporter
from rlmon.service.alerting.rules import parse_rules
from rlmon.service.metrics import catalog
from rlmon.service.service_core import ServiceCore
from tests.support.extras import optional_import
from tests.support.polling import wait_for
from tests.support.stop_support import InProcess, stopping_settings

pytestmark = pytest.mark.trl

optional_import("torch")
optional_import("trl")

from rlmon.actors.integrations.trl import RlmonCallback  # noqa: E402
from tests.support.trl_support import grpo_trainer  # noqa: E402

RUN = "trl-stop"
MAX_STEPS = 40
BROKEN_FROM = 3  # the reward function breaks at this trainer step and stays broken
RULES = f"""
rules:
  - name: RewardBroken
    severity: critical
    condition: threshold
    metric: {catalog.REWARD}
    op: "<"
    threshold: -5
    summary: The reward function returns garbage
    actions: [stop]
"""


def reward(completions: list[str], trainer_state: Any, **_: Any) -> list[float]:
    if trainer_state.global_step >= BROKEN_FROM:
        return [-10.0] * len(completions)
    return [0.1 * len(c.split()) for c in completions]


def test_a_broken_reward_stops_the_trainer_when_the_rule_says_so(tmp_path: Path) -> None:
    service = ServiceCore(stopping_settings({"trl-*": ["RewardBroken"]}),
                          state_dir=tmp_path / "state", rules=parse_rules(RULES)).start()
    path = InProcess(service)
    trainer = grpo_trainer(tmp_path / "out", reward, max_steps=MAX_STEPS, learning_rate=1e-3)
    rep = Reporter(RUN, "trainer", rank={}, world={}, sink=path, step_seconds=False)
    callback = RlmonCallback.attach(trainer, run=RUN, reporter=rep)
    try:
        trainer.train()
        steps = trainer.state.global_step
        assert callback.stopped is not None, f"ran all {steps} steps without stopping"
        stopped_at, why = callback.stopped
        assert "RewardBroken" in why and "rollout/reward" in why
        # the fault shows at step BROKEN_FROM + 1; the decision returns with a later step's ack
        assert BROKEN_FROM + 1 < stopped_at == steps <= BROKEN_FROM + 6 < MAX_STEPS
        # renewed by each step after the fault; the last one reaches the service on the
        # aggregator's publish thread, after the ack that carried the decision back
        assert rep.flush(10.0)
        decision = wait_for(lambda: (d := service.stops_for([RUN])[RUN]).step == steps and d,
                            10.0, f"the decision renewed by step {steps}")
        assert decision.alert == "RewardBroken"
        assert f"step {BROKEN_FROM + 1}:" in decision.reason  # where it fired
        print(f"stopped after step {steps} of max_steps={MAX_STEPS} "
              f"(the reward broke at step {BROKEN_FROM + 1})")
    finally:
        rep.close()
        path.close()
        service.close()
