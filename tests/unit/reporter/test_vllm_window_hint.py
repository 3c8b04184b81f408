"""vLLM without ``set_step`` reports time windows as steps: said once per process (issue 25),
so a user who expected the trainer's steps learns why the rollout's step numbers differ."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any, cast

import pytest

from rlmon.actors.integrations import vllm as rl_vllm
from rlmon.service.metrics import catalog
from tests.support.integrations_support import Hub


def test_time_windows_as_steps_are_said_once(caplog: pytest.LogCaptureFixture,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(rl_vllm._STATE, "said_windows", False)
    hub, now = Hub(), [1000.0]
    reporter = cast(Any, hub.reporter("win", "vllm", rank={"dp": 0}, world={"dp": 1}))
    window = rl_vllm.EngineWindow(reporter, 10.0, lambda: now[0])
    tokens = SimpleNamespace(num_generation_tokens=4, num_preempted_reqs=0)
    with caplog.at_level(logging.WARNING, logger=rl_vllm.__name__):
        for _ in range(3):
            window.record(None, tokens)
            now[0] += 10.0
        window.close()
    said = [r.getMessage() for r in caplog.records if "set_step" in r.getMessage()]
    assert said == ["rlmon: vLLM reports each 10-second window of its statistics as a step "
                    "(0, 1, 2, ...): no set_step call; call rlmon.actors.integrations.vllm."
                    "set_step(trainer_step) in the rollout loop to report under the trainer's "
                    "steps (docs/integrations.md)"]
    assert [(r.step, r.metrics[catalog.TOKENS]) for r in hub.records()] == [(0, 4), (1, 4), (2, 4)]
    hub.close()


def test_nothing_is_said_with_set_step(caplog: pytest.LogCaptureFixture,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(rl_vllm._STATE, "said_windows", False)
    hub = Hub()
    rl_vllm.set_step(5)
    try:
        reporter = cast(Any, hub.reporter("st", "vllm", rank={"dp": 0}, world={"dp": 1}))
        window = rl_vllm.EngineWindow(reporter, 10.0)
        with caplog.at_level(logging.WARNING, logger=rl_vllm.__name__):
            window.record(None, SimpleNamespace(num_generation_tokens=2, num_preempted_reqs=0))
            window.close()
    finally:
        rl_vllm.set_step(None)
    assert not [r for r in caplog.records if "set_step" in r.getMessage()]
    assert [r.step for r in hub.records()] == [5]
    hub.close()
