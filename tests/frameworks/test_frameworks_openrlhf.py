"""OpenRLHF's own loss functions on CPU tensors, against rlmon's OpenRLHF integration.

Driven (``openrlhf`` 0.11.2, installed without its dependencies): ``openrlhf.models.loss``
(``PolicyLoss``, ``ValueLoss``, ``aggregate_loss``), ``openrlhf.models.utils``
(``compute_approx_kl``, ``masked_mean``), ``openrlhf.utils.loss_utils._optimizer_step_loss_norm``
(the per-optimizer-step normalizer that ``ActorPPOTrainer.ppo_train`` feeds every micro-batch)
and the real ``Experience`` dataclass. ``openrlhf/models/__init__.py`` is not run: it imports
``actor.py`` (peft) and ``ring_attn_utils.py`` (flash_attn, CUDA-only), which these modules do
not use. ``ppo_train``'s cross-rank merge (value x tokens, all-reduce SUM, / tokens, then
token-weighted over micro-batches) needs a DeepSpeed engine on CUDA, so :func:`_ppo_train_merge`
restates it from ``openrlhf/trainer/ray/ppo_actor.py``; every value it merges comes from
OpenRLHF's functions.

The step: DP=2 x SP=2 (SP replicas hold the same micro-batches; only SP leaders report), 4
micro-batches per rank, gradient accumulation 2, 3 sequences per micro-batch with 1..16 action
tokens (uneven on purpose), token-level TIS correction in [0.5, 2].
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from rlmon.actors.integrations import openrlhf
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
# openrlhf/models/__init__.py imports Actor (peft) and ring attention (flash_attn, CUDA-only);
# loss.py and utils.py need neither, so the package is registered without running it.
or_loss = framework_module("openrlhf.models.loss", skip_init=("openrlhf.models",))
or_utils = framework_module("openrlhf.models.utils", skip_init=("openrlhf.models",))
or_norm = framework_module("openrlhf.utils.loss_utils")
or_exp = framework_module("openrlhf.trainer.ppo_utils.experience")

DP, SP, GAS, N_MB, ROWS, WIDTH = 2, 2, 2, 4, 3, 16
LOW, HIGH = 0.5, 2.0
STEP = 7

# Every OpenRLHF row of rlmon/service/metrics/keymaps.py: the test that checks it against OpenRLHF's own
# functions, or "" where the row says (``unchecked``) why it cannot be.
ROW_CHECKS = {
    "policy_loss": "test_worker_path_and_logger_against_policy_loss",
    "entropy_loss": "test_worker_path_and_logger_against_policy_loss",
    "ppo_clip_ratio": "test_worker_path_and_logger_against_policy_loss",
    "ppo_kl": "test_worker_path_and_logger_against_policy_loss",
    "vllm_kl": "test_worker_path_and_logger_against_policy_loss",
    "is_filter_ratio": "test_worker_path_and_logger_against_policy_loss",
    "kl": "test_worker_path_and_logger_against_policy_loss",
    "actor_lr": "test_worker_path_and_logger_against_policy_loss",
    "(not logged) IS ratio": "test_driver_hook_against_policy_loss_is_weights",
    "(not logged) IS ratio min": "test_driver_hook_against_policy_loss_is_weights",
    "(not logged) IS ratio max": "test_driver_hook_against_policy_loss_is_weights",
    "(not logged) logp diff": "test_driver_hook_against_policy_loss_is_weights",
    "(not logged) logp diff max": "test_driver_hook_against_policy_loss_is_weights",
    "(not logged) IS masked fraction": "test_driver_hook_against_policy_loss_is_weights",
    "critic_loss": "test_critic_keys_against_value_loss",
    "values": "test_critic_keys_against_value_loss",
    "actor_grad_norm": "",
    "critic_grad_norm": "",
    "reward": "",
    "response_length": "",
    "rollout/reward_mean": "",
    "rollout/truncated_rate": "",
    "timing/generation": "",
    "timing/ppo_train": "",
    "timing/broadcast": "",
}


@dataclass
class MicroBatch:
    old: Any  # action_log_probs at experience time (OpenRLHF's "old")
    new: Any  # log-probs of the policy being trained
    rollout: Any  # vLLM's
    base: Any  # reference policy
    adv: Any
    entropy: Any
    values: Any
    old_values: Any
    returns: Any
    mask: Any


def _micro_batches(seed: int) -> list[list[MicroBatch]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(DP):
        rank = []
        for _ in range(N_MB):
            lengths = rng.integers(1, WIDTH + 1, ROWS)
            mask = (np.arange(WIDTH)[None, :] < lengths[:, None]).astype(np.float64)
            old = rng.normal(-1.2, 0.5, (ROWS, WIDTH))
            t = lambda a: torch.tensor(a, dtype=torch.float64)  # noqa: E731
            rank.append(MicroBatch(
                old=t(old), new=t(old + rng.normal(0.0, 0.3, old.shape)),
                rollout=t(old + rng.normal(0.0, 0.45, old.shape)),
                base=t(old + rng.normal(0.0, 0.2, old.shape)),
                adv=t(np.repeat(rng.normal(0.0, 1.0, (ROWS, 1)), WIDTH, axis=1)),
                entropy=t(rng.gamma(2.0, 0.4, old.shape)),
                values=t(rng.normal(0.3, 0.5, old.shape)),
                old_values=t(rng.normal(0.3, 0.5, old.shape)),
                returns=t(rng.normal(0.5, 0.6, old.shape)), mask=t(mask)))
        out.append(rank)
    return out


def _ppo_train_merge(values: list[list[float]], weights: list[list[float]]) -> float:
    """ActorPPOTrainer.ppo_train: per micro-batch index, sum of value x weight over DP ranks
    divided by the summed weight; then weighted by the same weight over micro-batches."""
    merged = []
    for i in range(N_MB):
        w = sum(weights[r][i] for r in range(DP))
        merged.append((sum(values[r][i] * weights[r][i] for r in range(DP)) / w, w))
    return sum(v * w for v, w in merged) / sum(w for _, w in merged)


def _pooled(mbs: list[list[MicroBatch]], attr: str) -> np.ndarray:
    """Every action token of the step (un-split), float64."""
    return np.concatenate([getattr(mb, attr).numpy()[mb.mask.numpy() > 0]
                           for rank in mbs for mb in rank])


def _truth(mbs: list[list[MicroBatch]]) -> dict[str, float]:
    old, new, roll = _pooled(mbs, "old"), _pooled(mbs, "new"), _pooled(mbs, "rollout")
    adv, base, ent = _pooled(mbs, "adv"), _pooled(mbs, "base"), _pooled(mbs, "entropy")
    ratio = np.exp(new - old)
    surr1, surr2 = ratio * adv, np.clip(ratio, 0.8, 1.28) * adv
    rho = np.exp(old - roll)
    return {
        "loss": float((-np.minimum(surr1, surr2) * np.clip(rho, LOW, HIGH)).mean()),
        "clip_ratio": float((surr2 < surr1).mean()),
        "approx_kl": float((old - new).mean()),
        "vllm_kl": float((roll - old).mean()),
        "entropy": float(ent.mean()),
        "kl": float(np.clip(new - base, -10, 10).mean()),
        "is_ratio": float(rho.mean()), "is_ratio_min": float(rho.min()),
        "is_ratio_max": float(rho.max()),
        "logp_diff": float(np.abs(old - roll).mean()), "logp_diff_max": float(np.abs(old - roll).max()),
        "is_masked": float(((rho < LOW) | (rho > HIGH)).mean()),
    }


def _policy_loss() -> Any:
    return or_loss.PolicyLoss(clip_eps_low=0.2, clip_eps_high=0.28, is_correction_level="token",
                              is_correction_mode="clip", is_correction_threshold=(LOW, HIGH))


def _per_token(fn: Any, mb: MicroBatch) -> Any:
    """The per-token loss OpenRLHF aggregates: with ``batch_num_tokens=1`` and ``dp_size=1``
    ``aggregate_loss`` is ``(loss * mask).sum()``, whose gradient in the mask is the loss."""
    mask = mb.mask.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(fn(mask), mask)
    return grad.detach()


@pytest.fixture
def hub():
    h = Hub()
    yield h
    h.close()


def test_worker_path_and_logger_against_policy_loss(hub: Hub) -> None:
    ledger = Ledger("openrlhf")
    mbs = _micro_batches(0)
    truth = _truth(mbs)
    policy = _policy_loss()
    model = torch.nn.Linear(2, 1)
    optim = torch.optim.SGD(model.parameters(), lr=1e-6)
    sched = torch.optim.lr_scheduler.LambdaLR(optim, lambda s: 1.0 + s)
    logged: dict[str, list[list[float]]] = {k: [[] for _ in range(DP)] for k in (
        "policy_loss", "entropy_loss", "ppo_clip_ratio", "ppo_kl", "vllm_kl", "is_filter_ratio",
        "kl")}
    tokens: list[list[float]] = [[] for _ in range(DP)]
    paths = [(r, s, openrlhf.WorkerPath(
        "or", dp_rank=r, dp_size=DP, sp_rank=s,
        reporter=hub.reporter("or", "actor", rank={"dp": r}, world={"dp": DP}) if s == 0 else None))
        for r in range(DP) for s in range(SP)]
    assert [p.leader for _, _, p in paths] == [True, False, True, False]
    lr = 0.0
    for w in range(0, N_MB, GAS):
        # iter_grad_accum_global_norm: one normalizer per optimizer-step window, summed over DP
        info = or_norm._optimizer_step_loss_norm(
            [mbs[r][i].mask for r in range(DP) for i in range(w, w + GAS)], None, DP, GAS)
        for r in range(DP):
            for i in range(w, w + GAS):
                mb = mbs[r][i]
                loss, clip, ppo_kl, vllm_kl, filt = policy(
                    mb.new, mb.old, mb.adv, action_mask=mb.mask, rollout_log_probs=mb.rollout,
                    **info)
                kl_tok = or_utils.compute_approx_kl(mb.new, mb.base, kl_estimator="k1")
                for key, value in (("policy_loss", loss), ("ppo_clip_ratio", clip),
                                   ("ppo_kl", ppo_kl), ("vllm_kl", vllm_kl),
                                   ("is_filter_ratio", filt),
                                   ("entropy_loss", or_loss.aggregate_loss(mb.entropy, mb.mask, **info)),
                                   ("kl", or_loss.aggregate_loss(kl_tok, mb.mask, **info))):
                    logged[key][r].append(float(value))
                tokens[r].append(float(mb.mask.sum()))
                token_loss = _per_token(lambda m, mb=mb: policy(
                    mb.new, mb.old, mb.adv, action_mask=m, rollout_log_probs=mb.rollout,
                    dp_size=1, batch_num_tokens=1.0)[0], mb)
                ratio = (mb.new - mb.old).exp()
                clipped = (ratio.clamp(0.8, 1.28) * mb.adv < ratio * mb.adv).double()
                for rank, _, path in paths:  # both SP replicas of the rank see the micro-batch
                    if rank == r:
                        path.micro_batch(mb.mask, policy_loss=token_loss, entropy=mb.entropy,
                                         clipped=clipped, approx_kl=mb.old - mb.new, kl=kl_tok)
        optim.step()
        sched.step()
        lr = sched.get_last_lr()[0]
        for _, _, path in paths:
            path.optimizer_step(w // GAS, lr=lr)
    for _, _, path in paths:
        path.end_step(STEP)
    status = {k: _ppo_train_merge(v, tokens) for k, v in logged.items()}
    status["actor_lr"] = lr  # ppo_train keeps the last micro-batch's
    logger = openrlhf.RlmonLogger("or", reporter=hub.reporter("or", "driver"))
    logger.log_train(STEP, status)
    worker = hub.step("actor", STEP)
    assert worker.complete and worker.ranks_expected == DP
    rec, driver = worker.metrics, hub.step("driver", STEP).metrics

    # OpenRLHF's own un-split reduction: the whole step as one batch, masked_mean over it.
    every = {a: torch.cat([mb.__dict__[a] for rank in mbs for mb in rank]) for a in (
        "new", "old", "adv", "mask", "rollout", "entropy")}
    whole = policy(every["new"], every["old"], every["adv"], action_mask=every["mask"],
                   rollout_log_probs=every["rollout"])
    ledger.check(catalog.LOSS, "worker path", rec[catalog.LOSS], framework=float(whole[0]),
                 truth=truth["loss"])
    ledger.check("openrlhf/policy_loss", "logged (window-normalized)",
                 driver["openrlhf/policy_loss"], framework=status["policy_loss"],
                 truth=truth["loss"], differs_truth=True)
    ledger.check(catalog.LOSS, "logged vs worker path", rec[catalog.LOSS],
                 framework=status["policy_loss"], truth=truth["loss"], differs_framework=True)
    ledger.check(catalog.ENTROPY, "worker path", rec[catalog.ENTROPY],
                 framework=float(or_loss.aggregate_loss(every["entropy"], every["mask"])),
                 truth=truth["entropy"])
    ledger.check("openrlhf/entropy_loss", "logged (window-normalized)",
                 driver["openrlhf/entropy_loss"], framework=status["entropy_loss"],
                 truth=truth["entropy"], differs_truth=True)
    ledger.check(catalog.CLIP_RATIO, "logger", driver[catalog.CLIP_RATIO],
                 framework=status["ppo_clip_ratio"], truth=truth["clip_ratio"])
    ledger.check(catalog.CLIP_RATIO, "worker path", rec[catalog.CLIP_RATIO],
                 framework=float(whole[1]), truth=truth["clip_ratio"])
    ledger.check(catalog.APPROX_KL, "logger", driver[catalog.APPROX_KL],
                 framework=status["ppo_kl"], truth=truth["approx_kl"])
    ledger.check(catalog.APPROX_KL, "worker path", rec[catalog.APPROX_KL],
                 framework=float(whole[2]), truth=truth["approx_kl"])
    ledger.check("openrlhf/vllm_kl", "logger", driver["openrlhf/vllm_kl"],
                 framework=status["vllm_kl"], truth=truth["vllm_kl"])
    ledger.check("openrlhf/is_filter_ratio", "logger (token level)",
                 driver["openrlhf/is_filter_ratio"], framework=status["is_filter_ratio"],
                 truth=truth["is_masked"])
    # compute_approx_kl computes in float32: relayed exactly, compared with the truth at 1e-6
    ledger.check("openrlhf/kl", "logged (window-normalized)", driver["openrlhf/kl"],
                 framework=status["kl"], truth=truth["kl"], differs_truth=True, rel=1e-6)
    ledger.check(catalog.KL, "worker path", rec[catalog.KL], truth=truth["kl"], rel=1e-6)
    ledger.check(catalog.LR, "logger", driver[catalog.LR], framework=status["actor_lr"])
    ledger.check(catalog.LR, "worker path", rec[catalog.LR], framework=status["actor_lr"])
    assert catalog.LOSS not in driver and catalog.KL not in driver  # not comparable: relayed


def test_driver_hook_against_policy_loss_is_weights(hub: Hub) -> None:
    """OpenRLHF discards the IS weights; its PolicyLoss yields them when the PPO term is 1:
    new == old (ratio 1) and advantages -1 make the per-token loss the clip-mode coefficient,
    which with the band [0, inf) is exp(old - rollout) itself."""
    ledger = Ledger("openrlhf")
    mbs = _micro_batches(1)
    truth = _truth(mbs)
    weights_fn = or_loss.PolicyLoss(is_correction_level="token", is_correction_mode="clip",
                                    is_correction_threshold=(0.0, float("inf")))
    experiences, rho, filt, tokens = [], [], [[] for _ in range(DP)], [[] for _ in range(DP)]
    policy = _policy_loss()
    for r in range(DP):
        for mb in mbs[r]:
            minus_one = -torch.ones_like(mb.adv)
            w_tok = _per_token(lambda m, mb=mb, a=minus_one: weights_fn(
                mb.old, mb.old, a, action_mask=m, rollout_log_probs=mb.rollout,
                dp_size=1, batch_num_tokens=1.0)[0], mb)
            rho.append(w_tok[mb.mask > 0].numpy())
            filt[r].append(float(policy(mb.new, mb.old, mb.adv, action_mask=mb.mask,
                                        rollout_log_probs=mb.rollout)[4]))
            tokens[r].append(float(mb.mask.sum()))
            experiences.append(or_exp.Experience(
                action_log_probs=mb.old, rollout_log_probs=mb.rollout,
                action_mask=mb.mask.bool()))
    logger = openrlhf.RlmonLogger("or", reporter=hub.reporter("or", "driver"), is_low=LOW,
                                  is_high=HIGH, is_mode="tis")
    logger.record_experiences(experiences)
    logger.log_train(STEP, {})
    rec = hub.step("driver", STEP).metrics
    rho_all = np.concatenate(rho)
    ledger.check(catalog.IS_RATIO, "driver hook", rec[catalog.IS_RATIO],
                 framework=float(rho_all.mean()), truth=truth["is_ratio"])
    ledger.check(catalog.IS_RATIO_MIN, "driver hook", rec[catalog.IS_RATIO_MIN],
                 framework=float(rho_all.min()), truth=truth["is_ratio_min"])
    ledger.check(catalog.IS_RATIO_MAX, "driver hook", rec[catalog.IS_RATIO_MAX],
                 framework=float(rho_all.max()), truth=truth["is_ratio_max"])
    ledger.check(catalog.LOGP_DIFF, "driver hook", rec[catalog.LOGP_DIFF],
                 truth=truth["logp_diff"])
    ledger.check(catalog.LOGP_DIFF_MAX, "driver hook", rec[catalog.LOGP_DIFF_MAX],
                 truth=truth["logp_diff_max"])
    ledger.check(catalog.IS_MASKED_FRAC, "driver hook (token level)", rec[catalog.IS_MASKED_FRAC],
                 framework=_ppo_train_merge(filt, tokens), truth=truth["is_masked"])


def test_seq_level_filter_ratio_counts_sequences_not_tokens(hub: Hub) -> None:
    """At is_correction_level=seq OpenRLHF's is_filter_ratio is the fraction of *sequences* of
    a micro-batch (then token-weighted by ppo_train); rlmon's actor/is_masked_frac counts tokens."""
    ledger = Ledger("openrlhf")
    mbs = _micro_batches(2)
    seq = or_loss.PolicyLoss(is_correction_level="seq", is_correction_mode="mask",
                             is_correction_threshold=(0.9, 1.1))
    filt, tokens, experiences, bad_tokens, all_tokens = [[] for _ in range(DP)], \
        [[] for _ in range(DP)], [], 0.0, 0.0
    for r in range(DP):
        for mb in mbs[r]:
            filt[r].append(float(seq(mb.new, mb.old, mb.adv, action_mask=mb.mask,
                                     rollout_log_probs=mb.rollout)[4]))
            tokens[r].append(float(mb.mask.sum()))
            experiences.append(or_exp.Experience(action_log_probs=mb.old,
                                                 rollout_log_probs=mb.rollout,
                                                 action_mask=mb.mask.bool()))
            m = mb.mask.numpy()
            geo = np.exp(((mb.old - mb.rollout).numpy() * m).sum(1) / m.sum(1))
            bad_tokens += float(m.sum(1)[(geo < 0.9) | (geo > 1.1)].sum())
            all_tokens += float(m.sum())
    logger = openrlhf.RlmonLogger("or", reporter=hub.reporter("or", "driver"), is_low=0.9,
                                  is_high=1.1, is_mode="seq-mask-tis")
    logger.record_experiences(experiences)
    logger.log_train(STEP, {"is_filter_ratio": _ppo_train_merge(filt, tokens)})
    rec = hub.step("driver", STEP).metrics
    ledger.check(catalog.IS_MASKED_FRAC, "driver hook (seq level)", rec[catalog.IS_MASKED_FRAC],
                 framework=_ppo_train_merge(filt, tokens), truth=bad_tokens / all_tokens,
                 differs_framework=True)
    ledger.check("openrlhf/is_filter_ratio", "logger (seq level)",
                 rec["openrlhf/is_filter_ratio"], framework=_ppo_train_merge(filt, tokens))


def test_critic_keys_against_value_loss(hub: Hub) -> None:
    """CriticPPOTrainer.ppo_train all-reduces each micro-batch's status (mean over ranks) and
    averages over micro-batches: a mean of means, relayed under openrlhf/."""
    ledger = Ledger("openrlhf")
    mbs = _micro_batches(3)
    value_loss = or_loss.ValueLoss(clip_eps=0.2)
    per_mb = {"critic_loss": [], "values": []}
    for i in range(N_MB):
        rank_loss = [float(value_loss(mbs[r][i].values, mbs[r][i].old_values, mbs[r][i].returns,
                                      action_mask=mbs[r][i].mask)) for r in range(DP)]
        rank_values = [float(or_utils.masked_mean(mbs[r][i].values, mbs[r][i].mask))
                       for r in range(DP)]
        per_mb["critic_loss"].append(sum(rank_loss) / DP)
        per_mb["values"].append(sum(rank_values) / DP)
    status = {k: sum(v) / N_MB for k, v in per_mb.items()}
    logger = openrlhf.RlmonLogger("or", reporter=hub.reporter("or", "driver"))
    logger.log_train(STEP, status)
    rec = hub.step("driver", STEP).metrics
    v, ov, ret = _pooled(mbs, "values"), _pooled(mbs, "old_values"), _pooled(mbs, "returns")
    clipped = ov + np.clip(v - ov, -0.2, 0.2)
    truth_loss = float(0.5 * np.maximum((clipped - ret) ** 2, (v - ret) ** 2).mean())
    ledger.check("openrlhf/critic_loss", "logger", rec["openrlhf/critic_loss"],
                 framework=status["critic_loss"], truth=truth_loss, differs_truth=True)
    ledger.check("openrlhf/values", "logger", rec["openrlhf/values"], framework=status["values"],
                 truth=float(v.mean()), differs_truth=True)
    assert catalog.CRITIC_LOSS not in rec


def test_every_openrlhf_row_is_checked_or_says_why() -> None:
    check_row_coverage("openrlhf", ROW_CHECKS, globals())
