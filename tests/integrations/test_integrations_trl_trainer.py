"""TRL's GRPOTrainer running for real (CPU, a tiny local model) with rlmon's callback.

One module-scoped run: gradient_accumulation_steps=2 and num_iterations=2 (so every optimizer
step has two micro-batches of different token counts, and the clip ratios are not zero), beta>0
(so TRL logs ``kl``). Every value rlmon published for every step is compared with what TRL logged
(``trainer.state.log_history``) and with the token-weighted truth recomputed from the trainer's
own per-micro-batch tensors (tests/trl_support.py). A second, zero-reward run must fire
``NoLearningSignal`` through rlmon's rules engine and on the console of ``rlmon replay``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rlmon.service.metrics import catalog, keymaps
from tests.support.extras import optional_import
from tests.support.integrations_support import Hub, InfoSink

pytestmark = pytest.mark.trl

optional_import("torch")
optional_import("trl")

from rlmon.actors.integrations.trl import RlmonCallback  # noqa: E402
from tests.support.trl_support import Truth, close, grpo_trainer  # noqa: E402

STEPS = 10
EPS = 0.05
RUN = "trl-grpo"

# Rows the key map marks unchecked: TRL logs them only with use_vllm=True (vLLM importance
# sampling), which the CPU run does not use; the matrix marks them with `*`.
UNCHECKED = {row.key for row in keymaps.mappings("trl") if row.unchecked}
# TRL keys rlmon replaces by its exact values once bound to the trainer -> the truth's key.
LOSS_TRUTH = {catalog.KL: "kl", catalog.ENTROPY: "entropy",
              catalog.CLIP_RATIO: "clip_ratio/region_mean"}


def score(completion: str) -> float:
    return completion.count("cat") + 0.1 * len(completion.split())


@dataclass
class Run:
    trainer: Any
    callback: Any
    records: dict[int, dict[str, float]]  # rlmon's finalized steps
    relayed: dict[int, dict[str, float]]  # from a second callback, not bound to the trainer
    logged: dict[int, dict[str, float]]  # TRL's own logs, per step
    loss_truth: dict[int, dict[str, float]]
    rollout_truth: dict[int, dict[str, float]]


@pytest.fixture(scope="module")
def grpo(tmp_path_factory: pytest.TempPathFactory) -> Any:
    truth = Truth(num_generations=4, eps_low=EPS, eps_high=EPS)
    trainer = grpo_trainer(
        tmp_path_factory.mktemp("trl-grpo"), truth.reward_fn(score),
        gradient_accumulation_steps=2, num_iterations=2, beta=0.04, max_steps=STEPS,
        learning_rate=5e-3, epsilon=EPS,
    )
    hub, plain_hub = Hub(), Hub()
    callback = RlmonCallback.attach(trainer, run=RUN, reporter=hub.reporter(RUN, "trainer"),
                                    algorithm="grpo")
    trainer.add_callback(RlmonCallback(run="trl-relay",
                                       reporter=plain_hub.reporter("trl-relay", "trainer")))
    truth.hook(trainer)  # outermost: sees the tensors rlmon's hook sees, computes on its own
    trainer.train()
    logged: dict[int, dict[str, float]] = defaultdict(dict)
    for entry in trainer.state.log_history:
        logged[int(entry["step"])].update({k: v for k, v in entry.items() if k != "step"})
    run = Run(
        trainer, callback,
        {r.step: r.metrics for r in hub.records(finalize=True) if r.run == RUN},
        {r.step: r.metrics for r in plain_hub.records(finalize=True)},
        dict(logged), truth.loss_truth(), truth.rollout_truth(),
    )
    yield run
    hub.close()
    plain_hub.close()


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


def test_every_published_value_against_trl_and_the_truth(grpo: Run) -> None:
    assert sorted(grpo.records) == list(range(1, STEPS + 1))
    assert grpo.callback.fallbacks == 0
    n_fw = n_truth = diff_fw = diff_truth = 0
    per_key: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])  # fw n/diff, truth n/diff
    trl_error: dict[str, float] = defaultdict(float)  # TRL's logged value vs the truth, max rel
    wrong: list[str] = []
    for step, values in sorted(grpo.records.items()):
        logs = grpo.logged[step]
        truth: dict[str, float] = dict(grpo.rollout_truth.get(step, {}))
        for name, key in LOSS_TRUTH.items():
            if key in grpo.loss_truth.get(step, {}):
                truth[name] = grpo.loss_truth[step][key]
        for name, value in values.items():
            if name == catalog.STRAGGLER_SOURCE:
                continue
            keys = [k for k, n in grpo.callback.published.items() if n == name and k in logs]
            for key in keys:  # against what TRL logged for the same key
                want = logs[key]
                if name == catalog.REWARD_STD:  # TRL logs the sample std, rlmon the population
                    n = grpo.trainer.args.generation_batch_size  # one batch per step here
                    want = want * math.sqrt((n - 1) / n)
                n_fw += 1
                per_key[name][0] += 1
                if not close(value, want):
                    diff_fw += 1
                    per_key[name][1] += 1
                    if not name.startswith(("actor/kl", "actor/entropy", "actor/clip_ratio")):
                        wrong.append(f"step {step} {name}={value} but TRL logged {key}={want}")
            if name in truth or name in (catalog.GRAD_NORM, catalog.LR):
                # grad_norm and learning_rate are global values: TRL's own number is the truth
                want = truth[name] if name in truth else logs[keys[0]]
                n_truth += 1
                per_key[name][2] += 1
                if not close(value, want):
                    diff_truth += 1
                    per_key[name][3] += 1
                    wrong.append(f"step {step} {name}={value}, truth {want}")
            for name_, key in LOSS_TRUTH.items():
                if name == name_ and key in logs:
                    trl_error[key] = max(trl_error[key], _rel(logs[key], truth[name]))
    mapped = {n for n in per_key if catalog.lookup(n) is not None or any(
        keymaps.by_key("trl", k) for k, p in grpo.callback.published.items() if p == n)}
    m = [sum(per_key[n][i] for n in mapped) for i in range(4)]
    print(f"\nTRL GRPOTrainer, {STEPS} steps, gradient_accumulation_steps=2, num_iterations=2:")
    print(f"  (step, key) values compared with TRL's logs: {n_fw}, differing: {diff_fw} "
          f"(keys of the key map: {m[0]}, differing: {m[1]})")
    print(f"  (step, key) values compared with the token-weighted truth: {n_truth}, "
          f"differing: {diff_truth}")
    for name, (a, b, c, d) in sorted(per_key.items()):
        print(f"    {name:32s} vs TRL {a:3d} compared {b:3d} differ | vs truth {c:3d} compared "
              f"{d:3d} differ")
    for key, err in sorted(trl_error.items()):
        print(f"  TRL's logged {key!r} vs the truth: max error {100 * err:.2f} %")
    assert not wrong, "\n".join(wrong)
    assert n_truth >= 8 * STEPS and diff_truth == 0
    # The run is one where TRL's mean of micro-batch means is measurably off (else it proves
    # nothing), and the differences from TRL's logs are exactly those keys.
    assert trl_error["clip_ratio/region_mean"] > 1e-3 and trl_error["entropy"] > 1e-6
    assert diff_fw > 0


def test_truth_reproduces_trl_logged_mean_of_means(grpo: Run) -> None:
    """The truth's per-micro-batch means, averaged as TRL does, are TRL's logged values: the
    truth is computed from the same tensors with the same formulas."""
    checked = 0
    for step, truth in grpo.loss_truth.items():
        for key in ("kl", "entropy", "clip_ratio/low_mean", "clip_ratio/high_mean",
                    "clip_ratio/region_mean"):
            assert close(grpo.logged[step][key], truth[f"mom:{key}"]), (step, key)
            checked += 1
    assert checked == 5 * STEPS


def test_rollout_values_on_generation_steps_only(grpo: Run) -> None:
    # num_iterations=2: a generation batch serves two optimizer steps; TRL logs the rollout
    # keys on the step that generated it, and so does rlmon.
    gen_steps = sorted(grpo.rollout_truth)
    assert gen_steps == list(range(1, STEPS + 1, 2))
    for step, values in grpo.records.items():
        assert (catalog.REWARD in values) == (step in gen_steps), step
        assert catalog.KL in values and catalog.CLIP_RATIO in values and catalog.LR in values


def test_every_trl_row_of_the_matrix_is_checked_against_the_trainer(grpo: Run) -> None:
    """Each canonical TRL row: exact -> rlmon's value equals the truth at every step it appears
    (test above); relayed -> published under trl/<key> equal to TRL's number. The rows marked
    unchecked (use_vllm only) are the only ones left, and TRL indeed did not log them."""
    seen = {n for values in grpo.records.values() for n in values}
    unchecked = []
    for row in keymaps.mappings("trl"):
        if row.canonical is None:
            continue
        if row.key in UNCHECKED:
            assert all(row.key not in logs for logs in grpo.logged.values())
            unchecked.append(row.key)
            continue
        if row.fidelity is keymaps.Fidelity.RELAYED:
            name = keymaps.relay_name("trl", row.key)
            for step, values in grpo.records.items():
                assert values[name] == grpo.logged[step][row.key], (step, row.key)
        else:
            assert row.canonical in seen, f"{row.key}: {row.canonical} never published"
    assert set(unchecked) == UNCHECKED
    assert all(key.startswith("sampling/") for key in UNCHECKED)


def test_a_callback_not_bound_to_the_trainer_relays_lossy_keys_under_trl(grpo: Run) -> None:
    assert sorted(grpo.relayed) == list(range(1, STEPS + 1))
    for step, values in grpo.relayed.items():
        logs = grpo.logged[step]
        assert catalog.KL not in values and catalog.CLIP_RATIO not in values
        for key in ("kl", "entropy", "clip_ratio/region_mean", "loss"):
            assert values[f"trl/{key}"] == logs[key]
        if "reward" in logs:
            assert values[catalog.REWARD] == logs["reward"]
            assert values["trl/reward_std"] == logs["reward_std"]
            assert values["trl/completions/max_length"] == logs["completions/max_length"]


# --- a run with no learning signal ------------------------------------------------------------


class _Tee:
    """A sink that hands messages to the in-process assembler and to a JSONL file."""

    def __init__(self, *sinks: Any) -> None:
        self.sinks = sinks

    def send(self, messages: Any) -> None:
        for sink in self.sinks:
            sink.send(messages)


def test_zero_reward_fires_no_learning_signal(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    from rlmon.actors.reporter import Reporter
    from rlmon.actors.reporter.sink import JsonlSink
    from rlmon.cli import main
    from rlmon.service.alerting.engine import AlertEngine
    from rlmon.service.alerting.rules import default_rules

    engine = AlertEngine(default_rules())
    events: list[Any] = []
    local = InfoSink()
    local.on_record = lambda record: events.extend(engine.evaluate(record))
    path = tmp_path / "zero.jsonl"
    reporter = Reporter("trl-zero", "trainer", sink=_Tee(local, JsonlSink(str(path))),
                        rank={}, world={}, start_service=False)

    def zero(completions: list[str], **_: Any) -> list[float]:
        return [0.0] * len(completions)

    trainer = grpo_trainer(tmp_path / "out", zero, max_steps=4, beta=0.0)
    RlmonCallback.attach(trainer, run="trl-zero", reporter=reporter)
    trainer.train()
    assert reporter.flush(10.0)
    reporter.close()
    local.finalize_all()
    assert [r.metrics[catalog.FRAC_REWARD_ZERO_STD] for r in local.records] == [1.0] * 4
    fired = [(e.alert, e.step) for e in events if e.state == "firing"]
    assert ("NoLearningSignal", 3) in fired, fired
    # The same run through the product's replay and its console notifier.
    capsys.readouterr()
    main(["replay", str(path), "--alerts-to", "console"])
    err = capsys.readouterr().err
    assert "NoLearningSignal" in err, err
