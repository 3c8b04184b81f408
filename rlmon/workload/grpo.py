"""GRPO on a toy task, in numpy: real log-probabilities, importance ratios, clipping, KL, entropy.

The task: for each prompt a hidden target token; a response is a sequence of tokens (token 0 is
end-of-sequence) and earns reward 1 when it opens with the target. The policy is a table of logits per
prompt. The rollout engine holds its own copy of the weights, samples with top-k (as inference
engines do, at a temperature below 1) and reports the raw log-probabilities of the unprocessed
distribution, as vLLM's default ``raw_logprobs`` mode does. While weights are synced the
trainer/rollout ratio is exactly 1; once the rollout stops receiving weights, the ratio over the
tokens it samples drifts away from 1.

Ranks: sequences are split over DP ranks; each sequence's positions are split over CP ranks, so
token statistics are shards that sum, and per-sequence statistics are CP replicas counted once.
Everything a rank reports is a sufficient statistic (see :func:`shard_partials`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "Batch",
    "GRPOConfig",
    "Rollout",
    "Shard",
    "Trainer",
    "group_advantages",
    "make_shards",
    "reward_partials",
    "rollout_partials",
    "shard_partials",
    "simulate",
]

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]
EOS = 0


@dataclass(frozen=True, slots=True)
class GRPOConfig:
    num_prompts: int = 8
    prompts_per_step: int = 8
    group_size: int = 8
    vocab: int = 32
    max_len: int = 12
    top_k: int = 4
    temperature: float = 0.25
    lr: float = 30.0
    clip_eps: float = 0.2
    is_cap: float = 5.0  # truncated-IS cap: tokens above it count as masked
    minibatches: int = 4
    prior: float = 1.0  # initial logit bonus of each prompt's target token
    seed: int = 0


@dataclass(frozen=True, slots=True)
class Batch:
    """One step's rollouts: ``tokens``/``mask`` are [N, L]; ``logp_rollout`` is per token."""

    prompts: IntArray  # [N]
    tokens: IntArray  # [N, L]
    mask: FloatArray  # [N, L] 1 for response tokens
    logp_rollout: FloatArray  # [N, L]
    rewards: FloatArray  # [N]
    weights_version: int


def log_softmax(logits: FloatArray) -> FloatArray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    out: FloatArray = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    return out


def targets_for(config: GRPOConfig) -> IntArray:
    rng = np.random.default_rng(config.seed + 1)
    out: IntArray = rng.integers(1, config.vocab, size=config.num_prompts)
    return out


class Rollout:
    """An inference engine with its own copy of the policy weights."""

    def __init__(self, config: GRPOConfig, theta: FloatArray, seed: int = 0) -> None:
        self.config = config
        self.theta = theta.copy()
        self.version = 0
        self.rng = np.random.default_rng(seed)

    def sync(self, theta: FloatArray, version: int) -> None:
        self.theta = theta.copy()
        self.version = version

    def generate(self, prompts: IntArray, targets: IntArray) -> Batch:
        cfg = self.config
        n = len(prompts) * cfg.group_size
        rows = np.repeat(prompts, cfg.group_size)
        logp = log_softmax(self.theta[rows])  # [N, V]: the raw log-probabilities it reports
        # sampling: temperature, then top-k renormalised over the k most likely tokens
        tempered = np.exp(log_softmax(self.theta[rows] / cfg.temperature))
        kth = np.sort(logp, axis=1)[:, -cfg.top_k][:, None]
        probs = np.where(logp >= kth, tempered, 0.0)
        probs /= probs.sum(axis=1, keepdims=True)
        cum = np.cumsum(probs, axis=1)
        draws = self.rng.random((n, cfg.max_len))
        tokens = np.stack([(draws[:, t, None] > cum).sum(axis=1) for t in range(cfg.max_len)], 1)
        tokens = np.minimum(tokens, cfg.vocab - 1)
        ended = np.cumsum(tokens == EOS, axis=1)
        mask = ((ended == 0) | ((ended == 1) & (tokens == EOS))).astype(np.float64)
        logp_tokens = np.take_along_axis(logp, tokens, axis=1) * mask
        hit = tokens[:, 0] == targets[rows]
        return Batch(rows, tokens, mask, logp_tokens, hit.astype(np.float64), self.version)


def group_advantages(rewards: FloatArray, group_size: int) -> tuple[FloatArray, FloatArray]:
    """GRPO advantages (reward minus group mean, over group std) and a per-group zero-std flag."""
    groups = rewards.reshape(-1, group_size)
    mean = groups.mean(axis=1, keepdims=True)
    std = groups.std(axis=1, ddof=1, keepdims=True)
    adv = (groups - mean) / (std + 1e-6)
    zero_std = (std[:, 0] == 0).astype(np.float64)
    return adv.reshape(-1), zero_std


@dataclass(frozen=True, slots=True)
class Shard:
    """What one (dp, cp) rank holds of one mini-batch: its sequences and its CP slice of positions."""

    minibatch: int
    prompts: IntArray
    tokens: IntArray
    mask: FloatArray  # zero outside this CP rank's positions
    logp_rollout: FloatArray
    advantages: FloatArray
    rewards: FloatArray


def make_shards(
    batch: Batch, advantages: FloatArray, config: GRPOConfig, dp: int, cp: int, dp_rank: int,
    cp_rank: int,
) -> list[Shard]:
    """Sequences split over DP ranks and mini-batches; positions split over CP ranks."""
    n = len(batch.prompts)
    mine = np.arange(n)[dp_rank::dp]
    bounds = np.linspace(0, config.max_len, cp + 1).astype(int)
    cp_mask = np.zeros(config.max_len)
    cp_mask[bounds[cp_rank] : bounds[cp_rank + 1]] = 1.0
    shards = []
    for m, rows in enumerate(np.array_split(mine, config.minibatches)):
        shards.append(
            Shard(
                m, batch.prompts[rows], batch.tokens[rows], batch.mask[rows] * cp_mask,
                batch.logp_rollout[rows], advantages[rows], batch.rewards[rows],
            )
        )
    return shards


def shard_partials(
    shard: Shard, theta: FloatArray, theta_old: FloatArray, theta_ref: FloatArray,
    config: GRPOConfig,
) -> tuple[dict[str, dict[str, Any]], FloatArray, float]:
    """One rank's sufficient statistics for one mini-batch, its loss-gradient sum and token count.

    The gradient is a *sum* over this rank's tokens; the trainer divides by the global token count
    of the mini-batch, so the update is the exact token mean however tokens are split.
    """
    mask = shard.mask
    tokens = shard.tokens
    logp_all = log_softmax(theta[shard.prompts])  # [n, V]
    probs = np.exp(logp_all)
    logp = np.take_along_axis(logp_all, tokens, axis=1)
    logp_old = np.take_along_axis(log_softmax(theta_old[shard.prompts]), tokens, axis=1)
    logp_ref = np.take_along_axis(log_softmax(theta_ref[shard.prompts]), tokens, axis=1)
    adv = shard.advantages[:, None] * np.ones_like(mask)
    ratio = np.exp(logp - logp_old)
    eps = config.clip_eps
    unclipped, clipped = ratio * adv, np.clip(ratio, 1 - eps, 1 + eps) * adv
    loss_tok = -np.minimum(unclipped, clipped)
    is_clipped = (clipped < unclipped).astype(np.float64)
    entropy = -(probs * logp_all).sum(axis=1)[:, None] * np.ones_like(mask)
    # k3 estimator, clamped to [-10, 10] as verl's "low_var_kl" does: unclamped it explodes on
    # tokens the policy has all but ruled out.
    log_r = np.clip(logp_ref - logp, -20.0, 20.0)
    kl = np.clip(np.exp(log_r) - log_r - 1.0, -10.0, 10.0)
    approx_kl = 0.5 * (logp - logp_old) ** 2
    is_ratio = np.exp(logp_old - shard.logp_rollout)
    logp_diff = np.abs(logp_old - shard.logp_rollout)
    n_tok = float(mask.sum())
    on = mask > 0

    def tok(x: FloatArray) -> dict[str, Any]:
        return {"sum": float((x * mask).sum()), "count": n_tok}

    def extreme(x: FloatArray, kind: str) -> dict[str, Any]:
        if not on.any():
            return {kind: float("inf") if kind == "min" else float("-inf")}
        return {kind: float(x[on].min() if kind == "min" else x[on].max())}

    adv_tok = adv * mask
    partials: dict[str, dict[str, Any]] = {
        "actor/loss": tok(loss_tok),
        "actor/clip_ratio": tok(is_clipped),
        "actor/entropy": tok(entropy),
        "actor/kl": tok(kl),
        "actor/approx_kl": tok(approx_kl),
        "actor/ppo_ratio": tok(ratio),
        "actor/is_ratio": tok(is_ratio),
        "actor/is_ratio_min": extreme(is_ratio, "min"),
        "actor/is_ratio_max": extreme(is_ratio, "max"),
        "actor/logp_diff": tok(logp_diff),
        "actor/logp_diff_max": extreme(logp_diff, "max"),
        "actor/is_masked_frac": tok((is_ratio > config.is_cap).astype(np.float64)),
        "actor/advantage": tok(adv),
        "actor/advantage_std": {
            "count": n_tok, "sum": float(adv_tok.sum()), "sqsum": float((adv_tok**2).sum()),
        },
    }
    # d(-min(r A, clip(r) A))/d theta[p] = -A r (onehot - pi) where the unclipped branch is active
    active = (1.0 - is_clipped) * mask
    weight = -adv * ratio * active  # [n, L]
    grad = np.zeros_like(theta)
    onehot_w = np.zeros((len(tokens), theta.shape[1]))
    np.add.at(onehot_w, (np.repeat(np.arange(len(tokens)), tokens.shape[1]), tokens.ravel()),
              weight.ravel())
    per_seq = onehot_w - weight.sum(axis=1)[:, None] * probs
    np.add.at(grad, shard.prompts, per_seq)
    return partials, grad, n_tok


def reward_partials(rewards: FloatArray, zero_std: FloatArray) -> dict[str, dict[str, Any]]:
    """Per-response reward statistics (one reward worker: nothing replicated)."""
    return {
        "rollout/reward": {"sum": float(rewards.sum()), "count": float(len(rewards))},
        "rollout/reward_std": {
            "count": float(len(rewards)), "sum": float(rewards.sum()),
            "sqsum": float((rewards**2).sum()),
        },
        "rollout/reward_min": {"min": float(rewards.min())},
        "rollout/reward_max": {"max": float(rewards.max())},
        "rollout/frac_reward_zero_std": {"sum": float(zero_std.sum()), "count": float(len(zero_std))},
    }


def rollout_partials(batch: Batch, config: GRPOConfig, trainer_step: int,
                     seconds: float) -> dict[str, dict[str, Any]]:
    lengths = batch.mask.sum(axis=1)
    n = float(len(lengths))
    tokens = float(lengths.sum())
    return {
        "rollout/response_length": {"sum": tokens, "count": n},
        "rollout/response_length_max": {"max": float(lengths.max())},
        "rollout/clipped_ratio": {
            "sum": float(((lengths == config.max_len) & (batch.tokens[:, -1] != EOS)).sum()),
            "count": n,
        },
        "rollout/tokens": {"sum": tokens},
        "rollout/samples": {"sum": n},
        "rollout/policy_lag": {"max": float(trainer_step - batch.weights_version)},
        "rollout/tokens_per_second": {"sum": tokens / seconds if seconds > 0 else 0.0},
    }


class Trainer:
    """The policy weights, the frozen reference, and the optimizer step (plain SGD)."""

    def __init__(self, config: GRPOConfig) -> None:
        rng = np.random.default_rng(config.seed)
        self.config = config
        self.theta: FloatArray = rng.normal(0.0, 0.5, size=(config.num_prompts, config.vocab))
        # A "pretrained" start: the answer is already among the likelier tokens of each prompt.
        self.theta[np.arange(config.num_prompts), targets_for(config)] += config.prior
        self.theta_ref = self.theta.copy()
        self.version = 0

    def apply(self, grad_sum: FloatArray, tokens: float) -> float:
        """Token-mean gradient step; returns the global gradient norm before the step."""
        grad = grad_sum / max(tokens, 1.0)
        norm = float(np.linalg.norm(grad))
        self.theta = self.theta - self.config.lr * grad
        return norm


def simulate(
    steps: int = 30, dp: int = 2, cp: int = 2, fault_step: int | None = 3,
    run: str = "grpo-demo", config: GRPOConfig | None = None, start_time: float = 1.7e9,
) -> Iterator[dict[str, Any]]:
    """The whole workload in one process, yielding contract records (one per rank and step).

    From ``fault_step`` on, the rollout engine no longer receives weight updates.
    """
    cfg = config or GRPOConfig()
    trainer = Trainer(cfg)
    rollout = Rollout(cfg, trainer.theta, seed=cfg.seed + 2)
    targets = targets_for(cfg)
    prompt_rng = np.random.default_rng(cfg.seed + 3)
    world = {"dp": dp, "cp": cp}
    clock = start_time
    for step in range(steps):
        prompts = prompt_rng.choice(cfg.num_prompts, size=cfg.prompts_per_step, replace=False)
        batch = rollout.generate(prompts, targets)
        adv, zero_std = group_advantages(batch.rewards, cfg.group_size)
        gen_seconds = 0.05 + 0.001 * float(batch.mask.sum()) / 100
        clock += gen_seconds
        yield _record(run, "rollout", step, {}, {}, rollout_partials(batch, cfg, step, gen_seconds),
                      clock)
        yield _record(run, "reward", step, {}, {}, reward_partials(batch.rewards, zero_std), clock)
        theta_old = trainer.theta.copy()
        shards = {
            (d, c): make_shards(batch, adv, cfg, dp, cp, d, c) for d in range(dp) for c in range(cp)
        }
        per_rank: dict[tuple[int, int], list[dict[str, dict[str, Any]]]] = {k: [] for k in shards}
        for m in range(cfg.minibatches):
            grad_sum = np.zeros_like(trainer.theta)
            tokens = 0.0
            for key, rank_shards in shards.items():
                partials, grad, n_tok = shard_partials(
                    rank_shards[m], trainer.theta, theta_old, trainer.theta_ref, cfg
                )
                per_rank[key].append(partials)
                grad_sum += grad
                tokens += n_tok
            norm = trainer.apply(grad_sum, tokens)
            for key in shards:
                per_rank[key][-1]["actor/grad_norm"] = {"value": norm, "minibatch_reduce": "mean"}
        trainer.version = step + 1
        if fault_step is None or step + 1 < fault_step:
            rollout.sync(trainer.theta, trainer.version)
        clock += 0.08
        for (d, c), minibatch_partials in per_rank.items():
            for m, partials in enumerate(minibatch_partials):
                partials = dict(partials)
                if m == len(minibatch_partials) - 1:
                    partials["actor/lr"] = {"value": cfg.lr}
                    partials["perf/step_seconds"] = {"max": 0.08 + 0.002 * d + 0.001 * c}
                yield _record(run, "actor", step, {"dp": d, "cp": c}, world, partials, clock,
                              final=m == len(minibatch_partials) - 1, minibatch=m, seq=m)


def _record(run: str, role: str, step: int, rank: dict[str, int], world: dict[str, int],
            metrics: dict[str, dict[str, Any]], time: float, *, final: bool = True,
            minibatch: int = 0, seq: int | None = None) -> dict[str, Any]:
    record: dict[str, Any] = {"run": run, "role": role, "step": step}
    if rank:
        record["rank"] = rank
    if world:
        record["world"] = world
    if not final:
        record["final"] = False
    if seq is not None:
        record["seq"] = seq
    if minibatch:
        record["minibatch"] = minibatch
    record["time"] = round(time, 3)
    record["metrics"] = metrics
    return record
