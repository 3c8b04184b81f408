"""Done-when of issue 14's worst samples: a real TRL GRPO run (CPU, a tiny local model) whose
reward is broken for a subset of responses shows exactly those responses in ``rlmon samples``
and in the alert's webhook body.

The reward function gives -100 to every fourth completion it scores (a broken parser on a
subset) and records the text it broke. The service runs in-process with a loopback webhook and
a rule on the step's smallest reward; the callback ranks the gathered rewards on their device
and attaches prompt and completion text (``sample_text=True``) for the selected few only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rlmon.actors.reporter import Reporter
from rlmon.actors.reporter.sink import LocalSink
from rlmon.cli import main
from rlmon.service.alerting.rules import Condition, Rule, default_rules
from rlmon.service.metrics import catalog
from rlmon.service.service_core import ServiceCore
from rlmon.service.storage.stored_samples import NOTIFY_ITEMS
from tests.support.alerting_support import Receiver, wait_for, webhook_settings
from tests.support.extras import optional_import

pytestmark = pytest.mark.trl

optional_import("torch")
optional_import("trl")

from rlmon.actors.integrations.trl import RlmonCallback  # noqa: E402
from tests.support.trl_support import grpo_trainer  # noqa: E402

RUN = "trl-broken-reward"
BROKEN = -100.0


def test_a_broken_reward_shows_its_responses_in_rlmon_samples_and_the_webhook(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken: dict[int, set[str]] = {}  # step -> the completions whose reward broke
    seen = [0]

    def reward(completions: list[str], trainer_state: Any, **_: Any) -> list[float]:
        out = []
        for text in completions:
            seen[0] += 1
            if seen[0] % 4 == 0:
                broken.setdefault(trainer_state.global_step + 1, set()).add(text)
                out.append(BROKEN)
            else:
                out.append(float(len(text.split())))
        return out

    receiver = Receiver().start()
    settings = webhook_settings(receiver, tmp_path / "outbox.sqlite")
    rule = Rule(name="RewardBroken", severity="critical", condition=Condition.THRESHOLD,
                metric=catalog.REWARD_MIN, op="<", threshold=-50.0)
    service = ServiceCore(settings, state_dir=tmp_path, rules=[*default_rules(), rule]).start()
    reporter = Reporter(RUN, "trainer", sink=LocalSink(on_record=lambda r: service.publish([r])),
                        rank={}, world={}, start_service=False)
    try:
        trainer = grpo_trainer(tmp_path / "out", reward, max_steps=3, beta=0.0)
        RlmonCallback.attach(trainer, run=RUN, reporter=reporter, sample_text=True,
                             samples_k=4)
        trainer.train()
        assert reporter.flush(10.0)
        hooks = wait_for(lambda: [h for h in receiver.accepted("/hook") if any(
            a["alert"] == "RewardBroken" for a in h.body["alerts"])], 20, "RewardBroken")
        (alert,) = [a for a in hooks[0].body["alerts"] if a["alert"] == "RewardBroken"]
        step = alert["step"]
        samples = alert["worst_samples"]
        assert samples["metric"] == catalog.REWARD_LOWEST
        assert samples["more"] == (f"rlmon samples {RUN} --role trainer --step {step} "
                                   f"--state-dir {tmp_path.resolve()}")
        items = samples["items"]
        assert len(items) == NOTIFY_ITEMS
        # the broken responses first, each with its completion's text; then the next lowest
        hit = [i for i in items if i["score"] == BROKEN]
        assert len(hit) == min(NOTIFY_ITEMS, len(broken[step])) and items[:len(hit)] == hit
        assert {_completion(i["payload"]) for i in hit} <= broken[step]
        assert all(i["score"] > BROKEN for i in items[len(hit):])
    finally:
        reporter.close()
        service.close()
        receiver.stop()

    capsys.readouterr()
    assert main(["samples", RUN, "--alert", "RewardBroken", "--json",
                 "--state-dir", str(tmp_path)]) == 0
    (line,) = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert line["step"] == step and line["metric"] == catalog.REWARD_LOWEST
    stored = [i for i in line["items"] if i["score"] == BROKEN]
    assert len(line["items"]) == 4  # k = 4
    assert len(stored) == min(4, len(broken[step]))  # every broken response of the step...
    texts = {_completion(i["payload"]) for i in stored}
    assert texts == broken[step] if len(broken[step]) <= 4 else texts <= broken[step]
    assert main(["samples", RUN, "--step", str(step), "--metric", catalog.REWARD_HIGHEST,
                 "--state-dir", str(tmp_path)]) == 0
    table = capsys.readouterr().out
    assert "rollout/reward_highest" in table and str(BROKEN) not in table


def _completion(payload: str) -> str:
    """The completion part of the callback's payload ("completion: ...\\nprompt: ...")."""
    head, _, _prompt = payload.partition("\nprompt: ")
    assert head.startswith("completion: ")
    return head[len("completion: "):]
