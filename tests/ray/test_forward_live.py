"""Forwarding on Ray: the service actor starts the forward threads itself, and a Reporter's steps
reach TensorBoard event files (read back with TensorBoard's EventAccumulator) with the values the
service stored."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rlmon.actors.runtime import RuntimeOptions, ensure_runtime, shutdown_runtime
from rlmon.service.forward.tracker import TrackerRun
from tests.support.polling import PATIENCE_S, wait_for

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def _forwarded(log_dir: Path) -> dict[tuple[str, int], float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    run_dir = log_dir / TrackerRun("fwd-run").id
    if not run_dir.is_dir():
        return {}
    acc = EventAccumulator(str(run_dir), size_guidance={"tensors": 0})
    acc.Reload()
    return {(tag, e.step): float(tensor_util.make_ndarray(e.tensor_proto).item())
            for tag in acc.Tags()["tensors"] if not tag.startswith("rlmon_")
            for e in acc.Tensors(tag)}


def test_the_service_actor_forwards_a_reporters_steps(ray_cluster: Any, ray_namespace: str,
                                                      tmp_path: Path) -> None:
    from rlmon.actors.reporter import Reporter

    ray = ray_cluster
    log_dir = tmp_path / "tb"
    config = tmp_path / "rlmon.yaml"
    config.write_text("forward:\n  flush_seconds: 0.2\n  tensorboard:\n    enabled: true\n"
                      f"    log_dir: {log_dir}\n")
    opts = RuntimeOptions(config=str(config), state_dir=str(tmp_path / "state"), port=0)
    service = ensure_runtime(ray_namespace, opts)
    try:
        rep = Reporter("fwd-run", "actor", namespace=ray_namespace, runtime=opts)
        for step in range(3):
            rep.record("actor/kl", sum=0.1 * (step + 1), count=3.0)
            rep.end_step(step)
        assert rep.flush(PATIENCE_S)
        stored = wait_for(lambda: len(ray.get(service.steps.remote("fwd-run"))) == 3
                          and ray.get(service.steps.remote("fwd-run")), PATIENCE_S, "three steps")
        expected = {(f"actor/{name}".replace("actor/actor/", "actor/"), s["step"]): value
                    for s in stored for name, value in s["metrics"].items()}
        assert expected[("actor/kl", 2)] == pytest.approx(0.1)
        wait_for(lambda: set(_forwarded(log_dir)) >= set(expected), PATIENCE_S,
                 "the steps in TensorBoard")
        assert _forwarded(log_dir) == expected
        sent, = ray.get(service.stats.remote())["forward"]
        assert (sent.tracker, sent.steps_sent, sent.steps_dropped) == ("tensorboard", 3, 0)
    finally:
        shutdown_runtime(ray_namespace)
