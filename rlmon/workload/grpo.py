"""GRPO on a toy task, in numpy: real log-probabilities, importance ratios, clipping, KL, entropy.

The task: each prompt of a pool (``num_prompts``, 8 drawn per step) has a hidden answer of
``answer_length`` tokens. A response is a sequence of tokens (token 0 is end-of-sequence, EOS);
its reward is the fraction of the answer it gets right, position by position (partial credit, as
a fraction of unit tests passed), and 0 when it is cut off at the length limit (no final answer)
or shorter than ``min_length`` tokens (no working shown). The "pretrained" start gives each
prompt's answer tokens a margin over a plausible wrong token that varies over the pool (easy and
hard prompts) and ends most responses around ``eos_position``, too early for ``min_length`` about
a third of the time. So groups have mixed rewards (a learning signal), the reward rises as the policy
learns to finish its working and to answer, and the pool is far from solved after 100 steps.

The policy: the logits at position ``t`` of a response to prompt ``p`` whose previous token is
``a`` are ``theta[p, t] + theta[P + a, t] + theta[-1, t]``: a table per prompt and position, a
bigram table shared by every prompt (so a response's continuation depends on what it has said,
as in a language model), and a positional row shared by all (where the length behaviour lives).
Shared rows couple the prompts as shared weights do: an update on one mini-batch moves the
log-probabilities of every other.

A step is a GRPO step as verl and TRL make it: one rollout batch, group-normalised advantages, and
``epochs`` x ``minibatches`` updates with the PPO-clipped objective against the policy that
generated (verl's ppo_epochs and mini-batches, TRL's num_iterations; each prompt's group is dealt
over all mini-batches). After the first update the policy has moved, so the PPO ratio departs
from 1 and about a tenth of the tokens are clipped (Axolotl's guide: healthy below 0.1 to 0.2;
the alert is above 0.3).

The rollout engine holds its own copy of the weights, samples with top-k at a temperature below 1
(as inference engines do) and reports the raw log-probabilities of the unprocessed distribution,
as vLLM's default ``raw_logprobs`` mode does. While weights are synced the trainer/rollout ratio
is exactly 1.

Faults (:data:`FAULTS`), from ``fault_step`` on, and the default rules they fire with the default
config (``tests/e2e/test_demo_workload.py`` pins them):

- ``none``: nothing, over 30 steps or 100.
- ``stale_weights``: the rollout engine no longer receives weight updates. The trainer keeps
  learning (above all to stop ending early, which the stale engine keeps doing), so its
  log-probabilities of the tokens the engine samples drift away: ``LogprobMismatch`` about 3
  steps after the fault, ``ISRatioStale`` about 9 after, both staying on; ``LogprobDivergence``
  only about 45 steps after. The token-mean IS ratio stays near 1 (the engine samples close to
  its own distribution, so E[p_trainer / p_rollout] stays about 1), so ``ISRatioDivergence``
  does not fire.
- ``dead_rank``: the last policy rank (dp-1, cp-1) dies; its shard is lost and the survivors
  rescale, as an elastic job does. ``RankMissing`` at the fault step (critical), nothing else.
- ``lr_spike``: the learning rate is ``spike_factor`` (20) times too large for ``spike_steps``
  (8) steps, a bad schedule or a unit slip, then back to normal. Each update carries the policy
  past the PPO trust region, so a third or more of the tokens are clipped: ``ClipRatioHigh`` on
  the third spiked step, resolved a few steps after the spike. KL to the reference rises to about
  1.5, below ``KLDivergence``'s 2; entropy, gradient norm and rewards stay in range. The clip
  ratio during the spike is 0.3 to 0.45, close to the threshold, so an occasional seed (7 of 0-9)
  fires nothing.

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

from rlmon.service.metrics import catalog

__all__ = [
    "FAULTS",
    "Batch",
    "GRPOConfig",
    "Rollout",
    "Shard",
    "Trainer",
    "dead_rank",
    "group_advantages",
    "learning_rate",
    "make_shards",
    "reward_partials",
    "rollout_partials",
    "shard_partials",
    "simulate",
    "weights_synced",
]

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]
EOS = 0
FAULTS = ("stale_weights", "dead_rank", "lr_spike", "none")


@dataclass(frozen=True, slots=True)
class GRPOConfig:
    num_prompts: int = 128
    prompts_per_step: int = 8
    group_size: int = 8
    vocab: int = 32
    max_len: int = 12
    top_k: int = 6
    temperature: float = 0.7
    lr: float = 4.0
    clip_eps: float = 0.2
    is_cap: float = 5.0  # truncated-IS cap: tokens above it count as masked
    minibatches: int = 4
    epochs: int = 3  # passes over the rollout batch (TRL's num_iterations, verl's ppo_epochs)
    # the pretrained start: how far the favourite token of a position stands out, and the margin
    # of each prompt's answer over the likeliest wrong one (drawn uniformly in [low, high])
    favourite: float = 5.0
    answer_prior: tuple[float, float] = (-1.5, 1.0)
    eos_position: float = 4.5  # end-of-sequence is as likely as not around this position
    eos_slope: float = 1.2
    answer_length: int = 4  # the answer's tokens, the first of the response
    min_length: int = 6  # a response shorter than this (EOS included) earns nothing
    spike_factor: float = 20.0  # the lr_spike fault
    spike_steps: int = 8
    seed: int = 0


@dataclass(frozen=True, slots=True)
class Batch:
    """One step's rollouts: ``tokens``/``mask`` are [N, L]; ``logp_rollout`` is per token."""

    prompts: IntArray  # [N]
    tokens: IntArray  # [N, L]
    mask: FloatArray  # [N, L] 1 for response tokens (up to and including EOS)
    logp_rollout: FloatArray  # [N, L]
    rewards: FloatArray  # [N]
    weights_version: int


def log_softmax(logits: FloatArray) -> FloatArray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    out: FloatArray = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    return out


def targets_for(config: GRPOConfig) -> IntArray:
    """[P, answer_length]: each prompt's answer, a sequence of tokens (never EOS)."""
    rng = np.random.default_rng(config.seed + 1)
    out: IntArray = rng.integers(1, config.vocab, size=(config.num_prompts, config.answer_length))
    return out


def previous_tokens(tokens: IntArray) -> IntArray:
    """The token before each position: [n, L], EOS (begin-of-sequence) before the first."""
    prev = np.empty_like(tokens)
    prev[:, 0] = EOS
    prev[:, 1:] = tokens[:, :-1]
    return prev


def policy_logits(theta: FloatArray, prompts: IntArray, prev: IntArray) -> FloatArray:
    """[n, L', V] logits of responses to ``prompts`` whose previous tokens are ``prev`` [n, L']:
    the prompt's table at each position plus the shared bigram row of the previous token."""
    num_prompts = theta.shape[0] - theta.shape[2] - 1
    positions = np.arange(prev.shape[1])
    out: FloatArray = (theta[prompts][:, positions] + theta[num_prompts + prev, positions]
                       + theta[-1, positions])
    return out


def learning_rate(config: GRPOConfig, step: int, fault: str, fault_step: int) -> float:
    """The step's learning rate: ``spike_factor`` times too large during an ``lr_spike``."""
    if fault == "lr_spike" and fault_step <= step < fault_step + config.spike_steps:
        return config.lr * config.spike_factor
    return config.lr


def weights_synced(step: int, fault: str, fault_step: int) -> bool:
    """Whether the rollout engine receives the weights after trainer step ``step``."""
    return not (fault == "stale_weights" and step + 1 >= fault_step)


def dead_rank(step: int, fault: str, fault_step: int, dp: int, cp: int) -> tuple[int, int] | None:
    """The policy rank that is dead at ``step`` (the last one, from ``fault_step`` on), if any."""
    if fault == "dead_rank" and step >= fault_step and dp * cp > 1:
        return (dp - 1, cp - 1)
    return None


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
        rows = np.repeat(prompts, cfg.group_size)
        n = len(rows)
        draws = self.rng.random((n, cfg.max_len, 1))
        tokens = np.zeros((n, cfg.max_len), dtype=np.int64)
        logp_tokens = np.zeros((n, cfg.max_len))
        prev = np.full((n, 1), EOS, dtype=np.int64)
        for t in range(cfg.max_len):  # token by token: each depends on the one before
            logits = policy_logits(self.theta[:, t : t + 1], rows, prev)[:, 0]
            logp = log_softmax(logits)  # [N, V]: the raw log-probabilities it reports
            # sampling: temperature, then top-k renormalised over the k most likely tokens
            tempered = np.exp(log_softmax(logits / cfg.temperature))
            kth = np.sort(logp, axis=-1)[:, -cfg.top_k][:, None]
            probs = np.where(logp >= kth, tempered, 0.0)
            probs /= probs.sum(axis=-1, keepdims=True)
            token = np.minimum((draws[:, t] > np.cumsum(probs, axis=-1)).sum(axis=-1),
                               cfg.vocab - 1)
            tokens[:, t] = token
            logp_tokens[:, t] = logp[np.arange(n), token]
            prev = token[:, None]
        ended = np.cumsum(tokens == EOS, axis=1)
        mask = ((ended == 0) | ((ended == 1) & (tokens == EOS))).astype(np.float64)
        tokens = np.where(mask > 0, tokens, EOS)  # padding after the end
        logp_tokens *= mask
        k = cfg.answer_length
        finished = ended[:, -1] > 0
        right = tokens[:, :k] == targets[rows]
        long_enough = mask.sum(axis=1) >= cfg.min_length
        credit = right.mean(axis=1) * finished
        credit = credit * long_enough
        return Batch(rows, tokens, mask, logp_tokens, credit.astype(np.float64), self.version)


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
    rows: IntArray  # the sequences' places in the step's batch: their sample ids


# Samples of the lowest IS ratio each rank keeps per mini-batch (the step keeps as many).
SAMPLES_K = 3


def make_shards(
    batch: Batch, advantages: FloatArray, config: GRPOConfig, dp: int, cp: int, dp_rank: int,
    cp_rank: int,
) -> list[Shard]:
    """Sequences split over DP ranks, then dealt round-robin over mini-batches (so every prompt's
    group is spread over all of them); positions split over CP ranks."""
    n = len(batch.prompts)
    mine = np.arange(n)[dp_rank::dp]
    bounds = np.linspace(0, config.max_len, cp + 1).astype(int)
    cp_mask = np.zeros(config.max_len)
    cp_mask[bounds[cp_rank] : bounds[cp_rank + 1]] = 1.0
    shards = []
    for m in range(config.minibatches):
        rows = mine[m :: config.minibatches]
        shards.append(
            Shard(
                m, batch.prompts[rows], batch.tokens[rows], batch.mask[rows] * cp_mask,
                batch.logp_rollout[rows], advantages[rows], batch.rewards[rows], rows,
            )
        )
    return shards


def lowest_is_ratio(shard: Shard, is_ratio: FloatArray) -> dict[str, Any]:
    """The sequences of the shard with the smallest token IS ratio, as a ranked partial: id
    ``seq<n>`` (its place in the batch: a sequence's CP shards share it, so the merge keeps
    its smallest), payload its prompt and tokens."""
    on = shard.mask > 0
    worst = np.where(on, is_ratio, np.inf).min(axis=-1) if on.size else np.zeros(0)
    kept = [i for i in np.argsort(worst, kind="stable") if on[i].any()][:SAMPLES_K]
    return {"k": SAMPLES_K, "bottom": [
        [float(worst[i]), f"seq{int(shard.rows[i])}",
         f"prompt {int(shard.prompts[i])}: tokens "
         + " ".join(str(int(t)) for t in shard.tokens[i][shard.mask[i] > 0])]
        for i in kept]}


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
    idx = tokens[..., None]
    prev = previous_tokens(tokens)
    logp_all = log_softmax(policy_logits(theta, shard.prompts, prev))  # [n, L, V]
    probs = np.exp(logp_all)
    logp = np.take_along_axis(logp_all, idx, axis=-1)[..., 0]
    logp_old = np.take_along_axis(log_softmax(policy_logits(theta_old, shard.prompts, prev)), idx,
                                  axis=-1)[..., 0]
    logp_ref = np.take_along_axis(log_softmax(policy_logits(theta_ref, shard.prompts, prev)), idx,
                                  axis=-1)[..., 0]
    adv = shard.advantages[:, None] * np.ones_like(mask)
    ratio = np.exp(logp - logp_old)
    eps = config.clip_eps
    unclipped, clipped = ratio * adv, np.clip(ratio, 1 - eps, 1 + eps) * adv
    loss_tok = -np.minimum(unclipped, clipped)
    is_clipped = (clipped < unclipped).astype(np.float64)
    entropy = -(probs * logp_all).sum(axis=-1)
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
        catalog.LOSS: tok(loss_tok),
        catalog.CLIP_RATIO: tok(is_clipped),
        catalog.ENTROPY: tok(entropy),
        catalog.KL: tok(kl),
        catalog.APPROX_KL: tok(approx_kl),
        catalog.PPO_RATIO: tok(ratio),
        catalog.IS_RATIO: tok(is_ratio),
        catalog.IS_RATIO_MIN: extreme(is_ratio, "min"),
        catalog.IS_RATIO_MAX: extreme(is_ratio, "max"),
        catalog.LOGP_DIFF: tok(logp_diff),
        catalog.LOGP_DIFF_MAX: extreme(logp_diff, "max"),
        catalog.IS_MASKED_FRAC: tok((is_ratio > config.is_cap).astype(np.float64)),
        catalog.IS_RATIO_LOWEST: lowest_is_ratio(shard, is_ratio),
        catalog.ADVANTAGE: tok(adv),
        catalog.ADVANTAGE_STD: {
            "count": n_tok, "sum": float(adv_tok.sum()), "sqsum": float((adv_tok**2).sum()),
        },
    }
    # d(-min(r A, clip(r) A))/d logits = -A r (onehot - pi) where the unclipped branch is active;
    # the logits of (p, t) are theta[p, t] + theta[P, t], so both get the same gradient.
    weight = -adv * ratio * (1.0 - is_clipped) * mask  # [n, L]
    per_tok = -weight[..., None] * probs
    np.put_along_axis(per_tok, idx, np.take_along_axis(per_tok, idx, axis=-1) + weight[..., None],
                      axis=-1)
    grad = np.zeros_like(theta)
    np.add.at(grad, shard.prompts, per_tok)
    positions = np.broadcast_to(np.arange(tokens.shape[1]), tokens.shape)
    np.add.at(grad, (config.num_prompts + prev, positions), per_tok)
    grad[-1] += per_tok.sum(axis=0)
    return partials, grad, n_tok


def reward_partials(rewards: FloatArray, zero_std: FloatArray) -> dict[str, dict[str, Any]]:
    """Per-response reward statistics (one reward worker: nothing replicated)."""
    return {
        catalog.REWARD: {"sum": float(rewards.sum()), "count": float(len(rewards))},
        catalog.REWARD_STD: {
            "count": float(len(rewards)), "sum": float(rewards.sum()),
            "sqsum": float((rewards**2).sum()),
        },
        catalog.REWARD_MIN: {"min": float(rewards.min())},
        catalog.REWARD_MAX: {"max": float(rewards.max())},
        catalog.FRAC_REWARD_ZERO_STD: {"sum": float(zero_std.sum()), "count": float(len(zero_std))},
    }


def rollout_partials(batch: Batch, config: GRPOConfig, trainer_step: int,
                     seconds: float) -> dict[str, dict[str, Any]]:
    lengths = batch.mask.sum(axis=1)
    n = float(len(lengths))
    tokens = float(lengths.sum())
    return {
        catalog.RESPONSE_LENGTH: {"sum": tokens, "count": n},
        catalog.RESPONSE_LENGTH_MAX: {"max": float(lengths.max())},
        catalog.CLIPPED_RATIO: {
            "sum": float(((lengths == config.max_len) & (batch.tokens[:, -1] != EOS)).sum()),
            "count": n,
        },
        catalog.TOKENS: {"sum": tokens},
        catalog.SAMPLES: {"sum": n},
        catalog.POLICY_LAG: {"max": float(trainer_step - batch.weights_version)},
        catalog.TOKENS_PER_SECOND: {"sum": tokens / seconds if seconds > 0 else 0.0},
    }


class Trainer:
    """The policy weights, the frozen reference, and the optimizer step (plain SGD).

    ``theta`` is [P + V + 1, L, V]: a table per prompt and position, a bigram table per previous
    token, and the positional row last (see :func:`policy_logits`).
    """

    def __init__(self, config: GRPOConfig) -> None:
        rng = np.random.default_rng(config.seed)
        p, length, v = config.num_prompts, config.max_len, config.vocab
        self.config = config
        # A "pretrained" start, peaked as a language model is: at every position of every prompt
        # one token stands out of a noisy background by ``favourite`` logits.
        theta = rng.normal(0.0, 1.0, size=(p + v + 1, length, v))
        theta[-1] = 0.0
        theta[:, :, EOS] = 0.0
        favourite = rng.integers(1, v, size=(p, length))
        rows, cols = np.meshgrid(np.arange(p), np.arange(length), indexing="ij")
        theta[rows, cols, favourite] += config.favourite
        # Each answer token competes with the favourite token of its position (a plausible wrong
        # one) by a margin that varies over the pool: easy answers and hard ones.
        k = config.answer_length
        targets = targets_for(config)
        head = theta[:p, :k]  # [P, k, V]
        wrong = np.where(favourite[:, :k] == targets, targets % (v - 1) + 1, favourite[:, :k])
        pi, ti = np.meshgrid(np.arange(p), np.arange(k), indexing="ij")
        head[pi, ti, favourite[:, :k]] -= config.favourite
        head[pi, ti, wrong] += config.favourite
        low, high = config.answer_prior
        head[pi, ti, targets] = config.favourite + rng.uniform(low, high, size=(p, k))
        # Responses end: EOS (shared by every prompt) overtakes the favourite around
        # ``eos_position`` and is never first.
        positions = np.arange(length, dtype=np.float64)
        theta[-1, :, EOS] = config.favourite + config.eos_slope * (positions - config.eos_position)
        theta[-1, 0, EOS] = -10.0
        self.theta: FloatArray = theta
        self.theta_ref = self.theta.copy()
        self.version = 0

    def apply(self, grad_sum: FloatArray, tokens: float, lr: float | None = None) -> float:
        """Token-mean gradient step; returns the global gradient norm before the step."""
        grad = grad_sum / max(tokens, 1.0)
        norm = float(np.sqrt((grad * grad).sum()))  # not linalg.norm: BLAS threads, 2 cores
        self.theta = self.theta - (self.config.lr if lr is None else lr) * grad
        return norm


def simulate(
    steps: int = 30, dp: int = 2, cp: int = 2, fault_step: int | None = 3,
    run: str = "grpo-demo", config: GRPOConfig | None = None, start_time: float = 1.7e9,
    fault: str = "stale_weights",
) -> Iterator[dict[str, Any]]:
    """The whole workload in one process, yielding contract records (one per rank and step).

    ``fault`` (one of :data:`FAULTS`) starts at ``fault_step``; ``fault_step=None`` is no fault.
    The numbers are exactly those of the Ray demo (:class:`rlmon.actors.demo.DemoJob`).
    """
    if fault not in FAULTS:
        raise ValueError(f"fault must be one of {FAULTS}, got {fault!r}")
    if fault_step is None:
        fault, fault_step = "none", 0
    cfg = config or GRPOConfig()
    trainer = Trainer(cfg)
    rollout = Rollout(cfg, trainer.theta, seed=cfg.seed + 2)
    targets = targets_for(cfg)
    prompt_rng = np.random.default_rng(cfg.seed + 3)
    world = {"dp": dp, "cp": cp}
    all_ranks = [(d, c) for d in range(dp) for c in range(cp)]
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
        lr = learning_rate(cfg, step, fault, fault_step)
        dead = dead_rank(step, fault, fault_step, dp, cp)
        alive = [key for key in all_ranks if key != dead]
        theta_old = trainer.theta.copy()
        shards = {(d, c): make_shards(batch, adv, cfg, dp, cp, d, c) for d, c in alive}
        per_rank: dict[tuple[int, int], list[dict[str, dict[str, Any]]]] = {k: [] for k in shards}
        for m in range(cfg.epochs * cfg.minibatches):
            grad_sum = np.zeros_like(trainer.theta)
            tokens = 0.0
            for key, rank_shards in shards.items():
                partials, grad, n_tok = shard_partials(
                    rank_shards[m % cfg.minibatches], trainer.theta, theta_old, trainer.theta_ref,
                    cfg,
                )
                per_rank[key].append(partials)
                grad_sum += grad
                tokens += n_tok
            if dead is not None:  # the dead rank's shard is lost; rescale as an elastic job would
                tokens *= len(all_ranks) / len(alive)
            norm = trainer.apply(grad_sum, tokens, lr)
            for key in shards:
                per_rank[key][-1][catalog.GRAD_NORM] = {"value": norm, "minibatch_reduce": "mean"}
        trainer.version = step + 1
        if weights_synced(step, fault, fault_step):
            rollout.sync(trainer.theta, trainer.version)
        clock += 0.08
        for (d, c), minibatch_partials in per_rank.items():
            for m, partials in enumerate(minibatch_partials):
                partials = dict(partials)
                if m == len(minibatch_partials) - 1:
                    partials[catalog.LR] = {"value": lr}
                    partials[catalog.STEP_SECONDS] = {"max": 0.08 + 0.002 * d + 0.001 * c}
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
