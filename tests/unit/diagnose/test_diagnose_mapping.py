"""Keys mapped with the framework key maps: the framework told from its keys, each key's
canonical name and what its value is, lossy reductions flagged, unknown keys listed."""

from __future__ import annotations

import pytest

from rlmon.service.diagnose.findings import diagnose
from rlmon.service.diagnose.logged_run import LoggedRun
from rlmon.service.diagnose.mapping import KeyStatus, map_keys
from rlmon.service.metrics import catalog, keymaps

# keys as each framework's trackers log them (OpenRLHF's TensorBoard/W&B loggers add train/)
LOGGED = {
    "verl": ["actor/pg_loss", "actor/pg_clipfrac", "actor/entropy", "actor/grad_norm",
             "actor/lr", "critic/score/mean", "response_length/mean", "timing_s/step",
             "training/global_step"],
    "skyrl": ["policy/policy_loss", "policy/policy_entropy", "policy/grad_norm",
              "reward/avg_raw_reward", "generate/avg_num_tokens", "timing/step"],
    "openrlhf": ["train/policy_loss", "train/ppo_clip_ratio", "train/ppo_kl", "train/kl",
                 "train/reward", "train/actor_lr", "train/rollout/reward_mean",
                 "train/global_step"],
    "trl": ["train/loss", "train/grad_norm", "train/learning_rate", "train/reward",
            "train/entropy", "train/kl", "train/clip_ratio/low_mean", "train/global_step"],
}


@pytest.mark.parametrize("framework", sorted(LOGGED))
def test_the_framework_is_told_from_its_keys(framework: str) -> None:
    km = map_keys(LOGGED[framework])
    assert km.framework == framework and km.how == "detected from its keys"
    for info in km.of_status(KeyStatus.CANONICAL):
        row = keymaps.by_key(framework, info.key.removeprefix("train/"))
        assert row is not None and info.name == row.canonical
        assert info.fidelity == row.fidelity.value and info.lossy == (not row.comparable)


def test_each_key_says_what_its_value_is() -> None:
    by_key = {k.key: k for k in map_keys(LOGGED["verl"]).keys}
    clip = by_key["actor/pg_clipfrac"]
    assert (clip.name, clip.fidelity, clip.lossy) == (catalog.CLIP_RATIO, "relayed", True)
    assert clip.reduction == keymaps.Reduction.MEAN_OF_MEANS.value
    assert by_key["critic/score/mean"].name == catalog.REWARD
    assert not by_key["critic/score/mean"].lossy
    assert by_key["training/global_step"].status is KeyStatus.BOOKKEEPING


def test_a_second_key_for_one_canonical_name_is_relayed() -> None:
    km = map_keys(LOGGED["openrlhf"])
    reward = [k for k in km.keys if k.key in ("train/reward", "train/rollout/reward_mean")]
    assert sorted(k.status.value for k in reward) == ["canonical", "relayed"]
    assert len({k.name for k in reward}) == 2  # never two keys under one name


def test_unknown_keys_are_listed_and_still_watched_for_nan() -> None:
    rows = {s: {"train/entropy": 1.0, "train/my_metric": 0.5 if s != 3 else float("nan"),
                "eval/loss": 0.1} for s in range(1, 6)}
    d = diagnose(LoggedRun("x", "test", "x", rows), framework="trl")
    status = {k.key: k.status for k in d.keymap.keys}
    assert status["train/my_metric"] is KeyStatus.UNKNOWN
    assert status["eval/loss"] is KeyStatus.EVALUATION
    nan = next(f for f in d.findings if f.alert == "NonFiniteMetric")
    assert (nan.step, nan.key) == (3, "train/my_metric")


def test_canonical_names_from_a_home_grown_loop() -> None:
    km = map_keys([catalog.ENTROPY, catalog.REWARD, "my/loss"])
    assert km.framework is None
    assert [k.status for k in km.keys] == [KeyStatus.CANONICAL, KeyStatus.CANONICAL,
                                           KeyStatus.UNKNOWN]


def test_framework_given_overrides_detection() -> None:
    km = map_keys(["train/reward", "train/kl"], framework="openrlhf")
    assert km.framework == "openrlhf" and km.how == "given"
    assert {k.name for k in km.keys} == {catalog.REWARD, catalog.KL}


def test_a_run_without_a_known_key_says_so() -> None:
    d = diagnose(LoggedRun("x", "test", "x", {1: {"foo": 1.0}, 2: {"bar": 2.0}}))
    assert d.no_known_keys and d.keymap.framework is None
