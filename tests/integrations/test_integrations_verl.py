"""verl tracking backend against a replayed stream (verl needs GPUs to train).

The stand-in reproduces ``verl/utils/tracking.py``'s ``Tracking``: a ``supported_backend`` list,
``self.logger`` backends, and ``log(data, step)`` fanning out to every backend. The metric dict
has the keys of ``verl/trainer/ppo/metric_utils.py`` and the actor keys reduced by
``verl/utils/metric/utils.py`` (means of micro-batch means; losses summed over mini-batches).
"""

from __future__ import annotations

from typing import ClassVar

import pytest

from rlmon.actors.integrations import verl
from rlmon.service.metrics import catalog
from tests.support.integrations_support import Hub


class Tracking:
    supported_backend: ClassVar[list[str]] = ["wandb", "console"]

    def __init__(self, project_name, experiment_name, default_backend="console", config=None):
        backends = [default_backend] if isinstance(default_backend, str) else default_backend
        for b in backends:
            assert b in self.supported_backend, b
        self.logger = {b: object() for b in backends if b != "console"}
        self.logger.pop("wandb", None)

    def log(self, data, step, backend=None):
        for name, logger in self.logger.items():
            if backend is None or name in backend:
                logger.log(data=data, step=step)


@pytest.fixture
def hub():
    h = Hub()
    yield h
    h.close()


def test_install_adds_the_backend(hub: Hub) -> None:
    verl.install("verl-run", tracking_cls=Tracking, reporter=hub.reporter("verl-run", "driver"))
    verl.install("verl-run", tracking_cls=Tracking)  # idempotent
    assert "rlmon" in Tracking.supported_backend
    config = {"algorithm": {"adv_estimator": "grpo"},
              "actor_rollout_ref": {"actor": {"loss_agg_mode": "token-mean"}}}
    tracker = Tracking("proj", "exp", default_backend=["console", "rlmon"], config=config)
    info = hub.run_info["verl-run"]  # run metadata from verl's config
    assert (info.framework, info.algorithm, info.loss_reduction) == ("verl", "grpo", "token-mean")
    tracker.log({"actor/pg_loss": 0.4, "actor/pg_clipfrac": 0.1, "actor/lr": 1e-6,
                 "critic/score/mean": 0.6, "response_length/mean": 210.0,
                 "rollout_corr/rollout_is_max": 2.5, "timing_s/step": 30.0}, step=3)
    tracker.logger["rlmon"].finish()
    rec = hub.step("driver", 3).metrics
    assert rec[catalog.REWARD] == 0.6 and rec[catalog.RESPONSE_LENGTH] == 210.0
    assert rec[catalog.LR] == 1e-6
    assert rec["verl/rollout_corr/rollout_is_max"] == 2.5  # of the truncated weights: relayed
    assert catalog.IS_RATIO_MAX not in rec
    assert rec[catalog.STEP_SECONDS] == 30.0
    assert rec["verl/actor/pg_loss"] == 0.4 and rec["verl/actor/pg_clipfrac"] == 0.1
    assert catalog.CLIP_RATIO not in rec and catalog.LOSS not in rec


def test_tracking_without_rlmon_is_untouched() -> None:
    verl.install("verl-run", tracking_cls=Tracking)
    assert "rlmon" not in Tracking("p", "e", default_backend="console").logger
