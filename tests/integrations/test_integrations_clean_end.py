"""A clean end pages nothing, per integration: each closes its Reporter at its framework's end of
training (and says the planned steps), so the run reads finished and no stall or death is paged
however long the silence after it. Real Reporters into a real aggregator core and service on a
simulated clock (tests.support.integrations_support.ServiceHub); the frameworks' trainers are
stand-ins with the methods the integrations hook (they need GPUs; DeepSpeed's and vLLM's real
engines are checked in their own files, in the extras venv)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest

from rlmon.actors.integrations import openrlhf, skyrl, trl, verl
from tests.support.integrations_support import ServiceHub

SILENCE = 150.0  # past the stall floor (90 s) and the dead limit (30 s) of the defaults


@pytest.fixture
def hub(tmp_path: Path) -> Any:
    h = ServiceHub(tmp_path)
    yield h
    h.close()


def test_an_open_reporter_after_the_last_step_would_page_a_stall(hub: ServiceHub) -> None:
    """The control: the same silence with the Reporter left open pages (so the tests below
    can fail)."""
    rep = hub.reporter("open-run", "driver")
    for step in range(5):
        rep.record("actor/loss", sum=1.0, count=1.0)
        rep.end_step(step)
    assert ("open-run", "driver", "RunStalled", "firing") in hub.pages_after(SILENCE)


def test_openrlhf_fit_returning_closes_and_pages_nothing(hub: ServiceHub) -> None:
    class Trainer:  # the methods of openrlhf/trainer/ppo_trainer.py the integration hooks
        def get_max_steps(self) -> int:
            return 5

        def save_logs_and_checkpoints(self, global_step: int, logs: Any,
                                      client_states: Any = None) -> None:
            pass

        def fit(self) -> str:
            for step in range(1, 6):
                self.save_logs_and_checkpoints(step, {"ppo_kl": 0.001})
            return "done"

    trainer = Trainer()
    logger = openrlhf.attach(trainer, "or-run", reporter=hub.reporter("or-run", "driver"))
    assert logger.reporter.total_steps == 5
    assert trainer.fit() == "done"
    assert hub.pages_after(SILENCE) == []
    assert hub.states()[("or-run", "driver")] == "finished"


def test_skyrl_tracker_finish_closes_and_pages_nothing(hub: ServiceHub) -> None:
    tracker = skyrl.wrap_tracker(None, "sk-run", reporter=hub.reporter("sk-run", "driver"),
                                 total_steps=4)
    for step in range(4):
        tracker.log({"reward/avg_raw_reward": 0.5}, step=step, commit=True)
    tracker.finish()  # SkyRL's trainer at the end of fit
    assert hub.pages_after(SILENCE) == []
    assert hub.states()[("sk-run", "driver")] == "finished"


def test_verl_tracking_finish_closes_and_pages_nothing(hub: ServiceHub) -> None:
    class Tracking:  # verl/utils/tracking.py's shape
        supported_backend: ClassVar[list[str]] = ["console"]

        def __init__(self, project_name: str, experiment_name: str,
                     default_backend: Any = "console", config: Any = None) -> None:
            self.logger: dict[str, Any] = {}

        def log(self, data: Any, step: int) -> None:
            for logger in self.logger.values():
                logger.log(data=data, step=step)

    verl.install("verl-run", tracking_cls=Tracking, reporter=hub.reporter("verl-run", "driver"))
    tracker = Tracking("p", "e", default_backend=["rlmon"],
                       config={"trainer": {"total_training_steps": 3}})
    backend = tracker.logger["rlmon"]
    assert backend.reporter.total_steps == 3
    for step in range(1, 4):
        tracker.log({"critic/score/mean": 0.6}, step=step)
    backend.finish()  # Tracking.finish at the end of RayPPOTrainer.fit
    assert hub.pages_after(SILENCE) == []
    assert hub.states()[("verl-run", "driver")] == "finished"


def test_trl_on_train_end_closes_and_pages_nothing(hub: ServiceHub) -> None:
    relay = trl._Relay("trl-run", reporter=hub.reporter("trl-run", "trainer"))
    args, control = SimpleNamespace(), SimpleNamespace()
    state = SimpleNamespace(max_steps=3, global_step=0, is_world_process_zero=True)
    relay.on_train_begin(args, state, control)
    assert relay.reporter.total_steps == 3
    for step in range(1, 4):
        state.global_step = step
        relay.on_step_begin(args, state, control)
        relay.on_log(args, state, control, logs={"loss": 0.5})
    relay.on_train_end(args, state, control)
    assert hub.pages_after(SILENCE) == []
    assert hub.states()[("trl-run", "trainer")] == "finished"
