"""The early-warning rules on real TRL GRPOTrainer runs (CPU, the tiny local model, 200 steps):
at a learning rate the tiny policy takes calmly nothing of the early-warning pack fires; at one
too high for it the entropy slides steadily from 3.1 towards 0.6 and ``EntropySliding`` fires
while the entropy is still far above ``EntropyCollapse``'s line, tens of steps before the KL
crosses ``KLDivergence``'s. The rules see what the real trainer logs, through rlmon's callback
(the values themselves are checked against TRL in test_integrations_trl_trainer.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rlmon.service.alerting.engine import AlertEngine
from rlmon.service.alerting.rules import Condition, default_rules
from rlmon.service.metrics import catalog
from tests.support.extras import optional_import
from tests.support.integrations_support import Hub

pytestmark = [pytest.mark.trl, pytest.mark.slow]

optional_import("torch")
optional_import("trl")

from rlmon.actors.integrations.trl import RlmonCallback  # noqa: E402
from tests.support.trl_support import grpo_trainer  # noqa: E402

STEPS = 200
EARLY = {r.name for r in default_rules() if r.condition is Condition.BASELINE}


def reward(completions: list[Any], **_: Any) -> list[float]:
    """More "cat" and more words score higher: a reward the tiny policy can chase."""
    texts = [c if isinstance(c, str) else str(c) for c in completions]
    return [t.count("cat") + 0.1 * len(t.split()) for t in texts]


Transitions = dict[tuple[str, str], int]


def firings(tmp: Path, learning_rate: float) -> tuple[Transitions, dict[int, dict[str, float]]]:
    """Each (alert, state)'s first step, and the finalized steps' metrics."""
    trainer = grpo_trainer(tmp, reward, num_iterations=2, beta=0.04, max_steps=STEPS,
                           learning_rate=learning_rate)
    hub = Hub()
    RlmonCallback.attach(trainer, run="trl-ew", reporter=hub.reporter("trl-ew", "trainer"),
                         algorithm="grpo")
    trainer.train()
    records = sorted(hub.records(finalize=True), key=lambda r: (r.step, r.role))
    hub.close()
    engine = AlertEngine(default_rules())
    first: Transitions = {}
    for record in records:
        for event in engine.evaluate(record):
            first.setdefault((event.alert, event.state), event.step)
    return first, {r.step: r.metrics for r in records}


def test_a_calm_run_fires_no_early_warning(tmp_path: Path) -> None:
    first, metrics = firings(tmp_path, 3e-4)
    assert len(metrics) == STEPS
    entropy = [m[catalog.ENTROPY] for _, m in sorted(metrics.items())]
    assert entropy[-1] < entropy[0]  # it learns: the entropy falls, slowly
    assert not EARLY & {alert for alert, _ in first}, first


def test_a_sliding_entropy_warns_long_before_the_thresholds(tmp_path: Path) -> None:
    first, metrics = firings(tmp_path, 1e-3)
    assert ("EntropySliding", "firing") in first, first
    step = first["EntropySliding", "firing"]
    entropy = metrics[step][catalog.ENTROPY]
    assert entropy > 1.0  # EntropyCollapse's line is 0.01: the thresholds see nothing yet
    assert metrics[STEPS - 1][catalog.ENTROPY] < entropy / 2  # and the slide went on
    assert first.get(("KLDivergence", "firing"), STEPS) - step >= 20, first
    assert ("EntropyCollapse", "firing") not in first
    # it keeps firing while the entropy slides, not until the slide becomes the baseline's slope
    resolved = first.get(("EntropySliding", "resolved"), STEPS - 1)
    assert metrics[resolved][catalog.ENTROPY] < entropy / 3, (step, resolved)
