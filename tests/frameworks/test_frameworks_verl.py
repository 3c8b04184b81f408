"""verl's own loss and metric functions on CPU tensors, against rlmon's verl tracking backend.

Driven (``verl`` 0.9.1, installed without its dependencies): ``verl.trainer.ppo.core_algos``
(``agg_loss``, ``compute_policy_loss_vanilla``, ``compute_policy_loss_bypass_mode``,
``compute_value_loss``, ``kl_penalty``), ``verl.trainer.ppo.rollout_corr_helper``
(``compute_rollout_correction_and_rejection_mask``), ``verl.trainer.ppo.metric_utils``
(``compute_data_metrics`` on a real ``DataProto``), ``verl.utils.metric`` (``Metric``,
``Metric.aggregate_dp``, ``reduce_metrics``), ``verl.workers.config.FSDPActorConfig`` and the
real ``verl.utils.tracking.Tracking`` with rlmon installed as a backend.

verl 0.9.1 trains through its engine workers: ``workers/utils/losses.py::ppo_loss`` wraps each
micro-batch's loss in a ``Metric`` (SUM when the loss is normalized by the global batch, as with
dp > 1; MEAN for the loss function's metrics), ``engine_workers.py`` all-gathers them over DP and
calls ``Metric.aggregate_dp`` per mini-batch, and the trainer ``reduce_metrics`` the mini-batch
values (``ray_trainer.py``). Those modules need a GPU engine, so :func:`_update_actor` wires the
real functions the same way (the wiring is restated; every number is verl's).

The step: DP=2, 2 mini-batches of unequal token counts, 2 micro-batches of 2 sequences per rank.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from rlmon.actors.integrations import verl
from rlmon.service.metrics import catalog
from tests.support.frameworks_support import (
    Ledger,
    check_row_coverage,
    framework_module,
    optional_import,
)
from tests.support.integrations_support import Hub

pytestmark = pytest.mark.frameworks

torch = optional_import("torch")
ca = framework_module("verl.trainer.ppo.core_algos")
rc = framework_module("verl.trainer.ppo.rollout_corr_helper")
mu = framework_module("verl.trainer.ppo.metric_utils")
vm = framework_module("verl.utils.metric.utils")
wc = framework_module("verl.workers.config")
proto = framework_module("verl.protocol")
tracking = framework_module("verl.utils.tracking")
debug = framework_module("verl.utils.debug.metrics")
algo = framework_module("verl.trainer.config.algorithm")

DP, N_MINI, N_MICRO, MB_SIZE, WIDTH = 2, 2, 2, 2, 12
STEP = 5
THRESHOLD = 2.0

ROW_CHECKS = {
    "actor/pg_loss": "test_actor_update_metrics",
    "actor/pg_clipfrac": "test_actor_update_metrics",
    "actor/ppo_kl": "test_actor_update_metrics",
    "actor/entropy": "test_actor_update_metrics",
    "actor/kl_loss": "test_actor_update_metrics",
    "actor/lr": "test_actor_update_metrics",
    "critic/vf_loss": "test_actor_update_metrics",
    "critic/score/mean": "test_data_metrics_are_exact",
    "response_length/mean": "test_data_metrics_are_exact",
    "response_length/clip_ratio": "test_data_metrics_are_exact",
    "rollout_corr/rollout_is_mean": "test_rollout_correction_metrics",
    "rollout_corr/rollout_is_min": "test_rollout_correction_metrics",
    "rollout_corr/rollout_is_max": "test_rollout_correction_metrics",
    "training/rollout_probs_diff_mean": "test_rollout_probs_diff_is_in_probability_space",
    "actor/grad_norm": "",
    "timing_s/step": "",
}


def _t(a: np.ndarray) -> Any:
    return torch.tensor(a, dtype=torch.float64)


def _step(seed: int) -> list[list[list[dict[str, Any]]]]:
    """[mini-batch][dp rank][micro-batch] of per-token tensors. Mini-batch 0 holds short
    responses (1..3 tokens), mini-batch 1 long ones, and every other micro-batch drifts more."""
    rng = np.random.default_rng(seed)
    out = []
    for j in range(N_MINI):
        ranks = []
        for _ in range(DP):
            mbs = []
            for i in range(N_MICRO):
                lengths = rng.integers(1, 4, MB_SIZE) if j == 0 else rng.integers(8, WIDTH + 1,
                                                                                   MB_SIZE)
                mask = (np.arange(WIDTH)[None, :] < lengths[:, None]).astype(np.float64)
                drift = 2.0 if i % 2 else 1.0
                old = rng.normal(-1.2, 0.5, (MB_SIZE, WIDTH))
                mbs.append({
                    "old": _t(old), "new": _t(old + drift * rng.normal(0.0, 0.25, old.shape)),
                    "rollout": _t(old + drift * rng.normal(0.0, 0.4, old.shape)),
                    "ref": _t(old + drift * rng.normal(0.0, 0.2, old.shape)),
                    "adv": _t(np.repeat(rng.normal(0.0, 1.0, (MB_SIZE, 1)), WIDTH, axis=1)),
                    "values": _t(rng.normal(0.3, 0.5, old.shape)),
                    "vpreds": _t(rng.normal(0.3, 0.5, old.shape)),
                    "returns": _t(rng.normal(0.5, 0.6, old.shape)),
                    "mask": _t(mask)})
            ranks.append(mbs)
        out.append(ranks)
    return out


def _actor_config(**kw: Any) -> Any:
    return wc.FSDPActorConfig(strategy="fsdp", ppo_micro_batch_size_per_gpu=MB_SIZE, rollout_n=1,
                              ppo_mini_batch_size=DP * N_MICRO * MB_SIZE, clip_ratio=0.2,
                              clip_ratio_high=0.28, **kw)


def _update_actor(step: list[list[list[dict[str, Any]]]], micro: Any) -> dict[str, float]:
    """``micro(mb, global_batch_info) -> {key: (value, AggregationType)}`` per micro-batch; then
    Metric per rank, Metric.aggregate_dp per mini-batch, reduce_metrics over mini-batches."""
    per_minibatch: dict[str, list[float]] = {}
    for mini in step:
        info = {"dp_size": DP,
                "batch_num_tokens": float(sum(mb["mask"].sum() for rank in mini for mb in rank)),
                "global_batch_size": float(DP * N_MICRO * MB_SIZE), "loss_scale_factor": None}
        rank_metrics: list[dict[str, Any]] = []
        for rank in mini:
            merged: dict[str, Any] = {}
            for mb in rank:
                for key, (value, aggregation) in micro(mb, info).items():
                    merged.setdefault(key, vm.Metric(aggregation=aggregation)).append(value)
            rank_metrics.append(merged)
        for key in rank_metrics[0]:
            per_minibatch.setdefault(key, []).append(
                float(vm.Metric.aggregate_dp([m[key] for m in rank_metrics])))
    return {k: float(v) for k, v in vm.reduce_metrics(per_minibatch).items()}


def _pool(step: list[Any], f: Any) -> np.ndarray:
    return np.concatenate([f(mb)[mb["mask"].numpy() > 0] for mini in step for rank in mini
                           for mb in rank])


def _minibatch_means(step: list[Any], f: Any) -> float:
    return float(np.mean([np.concatenate([f(mb)[mb["mask"].numpy() > 0] for rank in mini
                                          for mb in rank]).mean() for mini in step]))


@pytest.fixture
def hub():
    h = Hub()
    yield h
    h.close()


def test_actor_update_metrics(hub: Hub) -> None:
    ledger = Ledger("verl")
    step = _step(20)
    cfg = _actor_config()
    SUM, MEAN = vm.AggregationType.SUM, vm.AggregationType.MEAN
    policy_loss = ca.get_policy_loss_fn("vanilla")

    def micro(mb: dict[str, Any], info: dict[str, Any]) -> dict[str, Any]:
        cfg.global_batch_info.update(info)
        mask = mb["mask"].bool()
        pg_loss, pg_metrics = policy_loss(old_log_prob=mb["old"], log_prob=mb["new"],
                                          advantages=mb["adv"], response_mask=mask,
                                          loss_agg_mode="token-mean", config=cfg)
        kld = ca.kl_penalty(logprob=mb["new"], ref_logprob=mb["ref"], kl_penalty="k1")
        kl_loss = ca.agg_loss(loss_mat=kld, loss_mask=mask, loss_agg_mode="token-mean", **info)
        vf_loss, _ = ca.compute_value_loss(vpreds=mb["vpreds"], returns=mb["returns"],
                                           values=mb["values"], response_mask=mask,
                                           cliprange_value=0.2, loss_agg_mode="token-mean", **info)
        # ppo_loss: SUM for the globally normalized losses (dp > 1), MEAN for pg_metrics
        out = {k: (v, MEAN) for k, v in pg_metrics.items()}
        out.update({"actor/pg_loss": (pg_loss, SUM), "actor/kl_loss": (kl_loss, SUM),
                    "critic/vf_loss": (vf_loss, SUM)})
        return out

    logged = _update_actor(step, micro)
    every = {k: torch.cat([mb[k] for mini in step for rank in mini for mb in rank])
             for k in ("new", "mask")}
    # ray_trainer: actor/entropy is agg_loss over the whole batch's recomputed entropies
    entropy = every["new"].neg().exp()  # any per-token tensor stands for the entropies
    logged["actor/entropy"] = float(ca.agg_loss(loss_mat=entropy, loss_mask=every["mask"].bool(),
                                                loss_agg_mode="token-mean"))
    logged["actor/lr"] = 1e-6
    backend = verl.RlmonBackend("verl", reporter=hub.reporter("verl", "driver"))
    backend.log(logged, step=STEP)
    rec = hub.step("driver", STEP).metrics

    ratio = lambda mb: np.exp((mb["new"] - mb["old"]).numpy())  # noqa: E731
    adv = lambda mb: mb["adv"].numpy()  # noqa: E731
    ppo_clip = lambda mb: np.maximum(-adv(mb) * ratio(mb),  # noqa: E731
                                     -adv(mb) * np.clip(ratio(mb), 0.8, 1.28))
    # dual-clip (clip_ratio_c = 3) bounds the loss of negative advantages
    pg = lambda mb: np.where(adv(mb) < 0,  # noqa: E731
                             np.minimum(-adv(mb) * 3.0, ppo_clip(mb)), ppo_clip(mb))
    clip = lambda mb: (-adv(mb) * np.clip(ratio(mb), 0.8, 1.28) > -adv(mb) * ratio(mb))  # noqa: E731
    kl = lambda mb: (mb["new"] - mb["ref"]).numpy()  # noqa: E731

    def vf(mb: dict[str, Any]) -> np.ndarray:
        v, vp, ret = mb["values"].numpy(), mb["vpreds"].numpy(), mb["returns"].numpy()
        return 0.5 * np.maximum((vp - ret) ** 2, (v + np.clip(vp - v, -0.2, 0.2) - ret) ** 2)

    for key, f in (("actor/pg_loss", pg), ("actor/kl_loss", kl), ("critic/vf_loss", vf)):
        # sum over micro-batches and DP of globally normalized losses: each mini-batch's token
        # mean, exact; then verl averages the mini-batches (not a step token mean)
        ledger.check(f"verl/{key}", "tracker vs mean of mini-batch token means", rec[f"verl/{key}"],
                     framework=logged[key], truth=_minibatch_means(step, f))
        ledger.check(f"verl/{key}", "tracker vs step token mean", rec[f"verl/{key}"],
                     framework=logged[key], truth=float(_pool(step, f).mean()), differs_truth=True)
    for key, f in (("actor/pg_clipfrac", clip), ("actor/ppo_kl",
                                                  lambda mb: (mb["old"] - mb["new"]).numpy())):
        ledger.check(f"verl/{key}", "tracker (mean of micro-batch means)", rec[f"verl/{key}"],
                     framework=logged[key], truth=float(_pool(step, f).mean()), differs_truth=True)
    ledger.check("verl/actor/entropy", "tracker (driver agg_loss, token-mean)",
                 rec["verl/actor/entropy"], framework=logged["actor/entropy"],
                 truth=float(_pool(step, lambda mb: np.exp(-mb["new"].numpy())).mean()))
    ledger.check(catalog.LR, "tracker", rec[catalog.LR], framework=logged["actor/lr"])
    for name in (catalog.LOSS, catalog.CLIP_RATIO, catalog.ENTROPY, catalog.KL, catalog.APPROX_KL,
                 catalog.CRITIC_LOSS):
        assert name not in rec, name  # relayed under verl/, never under the canonical name


def test_data_metrics_are_exact(hub: Hub) -> None:
    ledger = Ledger("verl")
    rng = np.random.default_rng(21)
    n, prompt_w = 8, 6
    lengths = rng.integers(1, WIDTH + 1, n)
    lengths[0] = WIDTH  # one response hits the length limit
    resp_mask = (np.arange(WIDTH)[None, :] < lengths[:, None]).astype(np.int64)
    scores = rng.choice([0.0, 0.5, 1.0], n)
    token_scores = np.zeros((n, WIDTH))
    token_scores[np.arange(n), lengths - 1] = scores
    batch = proto.DataProto.from_dict(tensors={
        "token_level_scores": _t(token_scores), "token_level_rewards": _t(token_scores),
        "advantages": _t(rng.normal(size=(n, WIDTH))), "returns": _t(rng.normal(size=(n, WIDTH))),
        "prompts": torch.ones((n, prompt_w), dtype=torch.long),
        "responses": torch.ones((n, WIDTH), dtype=torch.long),
        "response_mask": torch.tensor(resp_mask),
        "attention_mask": torch.tensor(np.concatenate([np.ones((n, prompt_w), np.int64),
                                                       resp_mask], axis=1))})
    logged = mu.compute_data_metrics(batch, use_critic=False)
    tracker = tracking.Tracking("p", "e", default_backend="console")
    tracker.logger["rlmon"] = verl.RlmonBackend("verl", reporter=hub.reporter("verl", "driver"))
    tracker.log(data=logged, step=STEP)
    rec = hub.step("driver", STEP).metrics
    for key, name, truth in (("critic/score/mean", catalog.REWARD, float(scores.mean())),
                             ("response_length/mean", catalog.RESPONSE_LENGTH,
                              float(lengths.mean())),
                             ("response_length/clip_ratio", catalog.CLIPPED_RATIO,
                              float((lengths == WIDTH).mean()))):
        ledger.check(name, f"tracker ({key})", rec[name], framework=logged[key], truth=truth)


def test_rollout_probs_diff_is_in_probability_space(hub: Hub) -> None:
    ledger = Ledger("verl")
    step = _step(23)
    every = {k: torch.cat([mb[k] for mini in step for rank in mini for mb in rank])
             for k in ("old", "rollout", "mask")}
    batch = proto.DataProto.from_dict(tensors={
        "rollout_log_probs": every["rollout"], "old_log_probs": every["old"],
        "response_mask": every["mask"].long(),
        "responses": torch.ones(every["mask"].shape, dtype=torch.long)})
    logged = debug.calculate_debug_metrics(batch)
    verl.RlmonBackend("verl", reporter=hub.reporter("verl", "driver")).log(logged, step=STEP)
    rec = hub.step("driver", STEP).metrics
    key = "training/rollout_probs_diff_mean"
    probs = _pool(step, lambda mb: np.abs(np.exp(mb["old"].numpy()) - np.exp(mb["rollout"].numpy())))
    logp = _pool(step, lambda mb: np.abs((mb["old"] - mb["rollout"]).numpy()))
    ledger.check(f"verl/{key}", "tracker vs |p - q|", rec[f"verl/{key}"], framework=logged[key],
                 truth=float(probs.mean()))
    ledger.check(f"verl/{key}", "tracker vs |log p - log q|", rec[f"verl/{key}"],
                 framework=logged[key], truth=float(logp.mean()), differs_truth=True)
    assert catalog.LOGP_DIFF not in rec


def test_rollout_correction_metrics(hub: Hub) -> None:
    """Decoupled mode: the helper on the whole batch (driver). Bypass mode: inside the policy
    loss per micro-batch, so ppo_loss wraps its metrics in MEAN Metrics like pg_clipfrac."""
    ledger = Ledger("verl")
    step = _step(22)
    every = {k: torch.cat([mb[k] for mini in step for rank in mini for mb in rank])
             for k in ("old", "rollout", "mask")}
    _, _, decoupled = rc.compute_rollout_correction_and_rejection_mask(
        old_log_prob=every["old"], rollout_log_prob=every["rollout"],
        response_mask=every["mask"], rollout_is="token", rollout_is_threshold=THRESHOLD)
    cfg = _actor_config(policy_loss=wc.PolicyLossConfig(
        rollout_correction=algo.RolloutCorrectionConfig(rollout_is="token",
                                                        rollout_is_threshold=THRESHOLD)))
    MEAN = vm.AggregationType.MEAN

    def micro(mb: dict[str, Any], info: dict[str, Any]) -> dict[str, Any]:
        cfg.global_batch_info.update(info)
        # bypass: the batch's old_log_probs are the rollout's; log_prob is the trained policy's
        _, metrics = ca.compute_policy_loss_bypass_mode(
            old_log_prob=mb["rollout"], log_prob=mb["old"], advantages=mb["adv"],
            response_mask=mb["mask"].bool(), loss_agg_mode="token-mean", config=cfg)
        return {k: (v, MEAN) for k, v in metrics.items() if k.startswith("rollout_corr/")}

    bypass = _update_actor(step, micro)
    rho = _pool(step, lambda mb: np.exp((mb["old"] - mb["rollout"]).numpy()))
    assert rho.max() > THRESHOLD  # so truncation changes the logged numbers
    truth = {"mean": float(rho.mean()), "min": float(rho.min()), "max": float(rho.max())}
    for mode, logged in (("decoupled", decoupled), ("bypass", bypass)):
        backend = verl.RlmonBackend("verl", reporter=hub.reporter("verl", mode))
        backend.log(logged, step=STEP)
        rec = hub.step(mode, STEP).metrics
        for stat in ("mean", "max"):
            key = f"rollout_corr/rollout_is_{stat}"
            ledger.check(f"verl/{key}", f"tracker, {mode} mode", rec[f"verl/{key}"],
                         framework=logged[key], truth=truth[stat], differs_truth=True)
        key = "rollout_corr/rollout_is_min"
        # TIS clamps from above only, so the decoupled min is the ratio's; bypass averages minima
        ledger.check(f"verl/{key}", f"tracker, {mode} mode", rec[f"verl/{key}"],
                     framework=logged[key], truth=truth["min"], differs_truth=mode == "bypass")
        for name in (catalog.IS_RATIO, catalog.IS_RATIO_MIN, catalog.IS_RATIO_MAX):
            assert name not in rec, name
    assert decoupled["rollout_corr/rollout_is_max"] == pytest.approx(THRESHOLD)


def test_install_on_the_real_tracking_class(hub: Hub) -> None:
    """verl.install patches verl.utils.tracking.Tracking; trainer.logger=[..., 'rlmon'] works."""
    cls = type("Tracking", (tracking.Tracking,), {})  # a subclass: the patch stays local
    cls.supported_backend = list(tracking.Tracking.supported_backend)
    verl.install("verl", tracking_cls=cls, reporter=hub.reporter("verl", "driver"))
    tracker = cls("p", "e", default_backend=["console", "rlmon"],
                  config={"algorithm": {"adv_estimator": "grpo"},
                          "actor_rollout_ref": {"actor": {"loss_agg_mode": "token-mean"}}})
    assert "console" in tracker.logger and "rlmon" in tracker.logger
    tracker.log(data={"critic/score/mean": 0.25}, step=1)
    assert hub.step("driver", 1).metrics[catalog.REWARD] == 0.25
    assert hub.run_info["verl"].loss_reduction == "token-mean"


def test_every_verl_row_is_checked_or_says_why() -> None:
    check_row_coverage("verl", ROW_CHECKS, globals())
