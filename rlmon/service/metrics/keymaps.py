"""Framework key maps: each framework's metric keys, its own reduction, and what rlmon does.

The same key means different things in different frameworks, and the same framework reduces its
keys differently (token-weighted, sample-weighted, mean of micro-batch means, last micro-batch).
This table is the one place that says so. Each row names the canonical catalog metric the key
corresponds to (checked against :mod:`rlmon.service.metrics.catalog` at import), the framework's own
reduction, and the *fidelity* of the value rlmon reports:

- ``exact``: rlmon computes the canonical value itself from raw per-token or per-rank data
  (sufficient statistics pooled once), or the framework's reduction is provably exact for it; the
  value does not depend on how the step was split over ranks and micro-batches.
- ``recomputed``: rlmon rebuilds the canonical value from the framework's numbers by reproducing
  or undoing a known reduction (SkyRL's loss sum over micro-batches and DP then mean over
  mini-batches; DeepSpeed's 1/gradient-accumulation loss scaling; prefix-cache hits over queries).
- ``relayed``: forwarded as the framework reduced it. When that reduction is lossy the row is
  marked not comparable across runs, the integrations publish it under ``<framework>/<key>``
  rather than the canonical name, and :mod:`rlmon.service.alerting.sanity` warns about it.

Rows are data only; the integrations under :mod:`rlmon.actors.integrations` read them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Any

from rlmon.service.metrics import catalog
from rlmon.service.metrics.catalog import (
    APPROX_KL,
    CLIP_RATIO,
    CLIPPED_RATIO,
    CRITIC_GRAD_NORM,
    CRITIC_LOSS,
    CRITIC_VALUE,
    ENTROPY,
    FRAC_REWARD_ZERO_STD,
    GENERATE_SECONDS,
    GRAD_NORM,
    IS_MASKED_FRAC,
    IS_RATIO,
    IS_RATIO_MAX,
    IS_RATIO_MIN,
    KL,
    KV_CACHE_USAGE,
    KV_CACHE_USAGE_MAX,
    LOGP_DIFF,
    LOGP_DIFF_MAX,
    LOSS,
    LOSS_SCALE,
    LR,
    NUM_RUNNING_REQS,
    NUM_RUNNING_REQS_MAX,
    NUM_WAITING_REQS,
    NUM_WAITING_REQS_MAX,
    PREEMPTIONS,
    PREFIX_CACHE_HIT_RATE,
    RESPONSE_LENGTH,
    RESPONSE_LENGTH_MAX,
    REWARD,
    REWARD_MAX,
    REWARD_MIN,
    REWARD_STD,
    SAMPLES,
    SKIPPED_STEPS,
    STEP_SECONDS,
    TOKENS,
    TOKENS_PER_SECOND,
    TRAIN_SECONDS,
    WEIGHT_SYNC_SECONDS,
)

__all__ = [
    "FRAMEWORKS",
    "Fidelity",
    "KeyMapping",
    "Reduction",
    "by_key",
    "canonical",
    "keymap_json",
    "keymap_markdown",
    "mappings",
    "relay_name",
]


class Reduction(StrEnum):
    """How the framework itself reduces a key before it logs it."""

    TOKEN_WEIGHTED = "token-weighted"
    SAMPLE_WEIGHTED = "sample-weighted"
    MEAN_OF_MEANS = "mean of micro-batch means"
    LAST = "last micro-batch"
    WINDOW_NORMALIZED = "loss normalized per accumulation window"
    SUM_DP_MEAN_MINIBATCH = "sum over micro-batches and DP, mean over mini-batches"
    SUM_MINIBATCHES = "sum over mini-batches x epochs"
    MEAN_OF_RANK_MEANS = "mean of per-rank means"
    WINDOW_MEAN = "mean over the logging window"
    DRIVER_EXACT = "exact on the driver (full batch)"
    GLOBAL_VALUE = "already global (replicated over SP/TP/DP)"
    MAX = "max"
    MIN = "min"
    ENGINE_COUNTERS = "per-engine counters"
    LOSS_SCALED_BY_GAS = "loss scaled by 1/gradient_accumulation_steps"


class Fidelity(StrEnum):
    EXACT = "exact"
    RECOMPUTED = "recomputed"
    RELAYED = "relayed"


@dataclass(frozen=True, slots=True)
class KeyMapping:
    """One framework key and what rlmon makes of it.

    ``via`` names the rlmon path that produces the canonical value (``logger``, ``tracker``,
    ``callback``, ``driver hook``, ``worker path``, ``stat logger``, ``engine probe``).
    ``comparable`` says whether the framework's own logged number is comparable across runs and
    configurations; when it is not, relays go to :func:`relay_name` and sanity warns.
    ``unchecked`` says why no test checks the row against the framework's own functions (empty:
    a test does; for OpenRLHF, SkyRL and verl, ``tests/frameworks/test_frameworks_<framework>.py``).
    """

    framework: str
    key: str
    canonical: str | None
    reduction: Reduction
    fidelity: Fidelity
    via: str
    comparable: bool = True
    note: str = ""
    source: str = ""
    unchecked: str = ""


_OR_ACTOR = "openrlhf/trainer/ray/ppo_actor.py"
_OR_DRIVER = "openrlhf/trainer/ppo_trainer.py"
_OR_CRITIC = "openrlhf/trainer/ray/ppo_critic.py"
_SK_WORKER = "skyrl/backends/skyrl_train/workers/worker_utils.py"
_SK_TRAINER = "skyrl/train/trainer.py"
_VERL = "verl/utils/metric/utils.py"
_VERL_DATA = "verl/trainer/ppo/metric_utils.py"
_VERL_RC = "verl/trainer/ppo/rollout_corr_helper.py"
_VERL_LOSS_NOTE = ("verl 0.9 engine workers: each micro-batch's loss normalized by the "
                   "mini-batch's global token count, summed over micro-batches and DP (Metric "
                   "SUM): the mini-batch token mean; then averaged over mini-batches x epochs "
                   "(the pre-0.9 workers summed them, verl PR #5766)")
_TRL = "trl/trainer/grpo_trainer.py"
_TRL_VLLM = ("logged only with use_vllm=True (vLLM importance-sampling correction); the CPU "
             "GRPOTrainer run in CI generates without vLLM")
_VLLM = "vllm/v1/metrics/stats.py"
_TIMER = "a wall-clock timer of the driver: nothing to compute on CPU"
_OR_UNCHECKED_TRAIN = ("per-sample values merged in ActorPPOTrainer.ppo_train, which needs a "
                       "DeepSpeed engine on CUDA")
_OR_UNCHECKED_DRIVER = ("BasePPOTrainer._compute_rollout_stats: openrlhf/trainer/ppo_trainer.py "
                        "imports the Actor stack (peft, flash_attn: CUDA-only)")
_DS = "deepspeed/runtime/engine.py"


def _row(framework: str, key: str, *, canonical: str | None, reduction: Reduction,
         fidelity: Fidelity, via: str, comparable: bool = True, note: str = "", source: str = "",
         unchecked: str = "") -> KeyMapping:
    """One row; ``canonical`` is checked against the catalog (KeyError at import if unknown)."""
    return KeyMapping(framework, key, catalog.get(canonical).name if canonical else None,
                      reduction, fidelity, via, comparable=comparable, note=note, source=source,
                      unchecked=unchecked)


_ROWS: tuple[KeyMapping, ...] = (
    # --- OpenRLHF (status keys; W&B/TB prefix them with train/) ----------------------------------
    _row("openrlhf", "policy_loss", canonical=LOSS, reduction=Reduction.WINDOW_NORMALIZED,
         fidelity=Fidelity.EXACT, via="worker path", comparable=False,
         note="a per-micro-batch contribution normalized by the window's global token count, then "
              "token-weighted again: biased under uneven token counts, about 1/micro-batches in "
              "dynamic-batch mode; rlmon recomputes the token mean from raw masked sums",
         source=_OR_ACTOR),
    _row("openrlhf", "entropy_loss", canonical=ENTROPY, reduction=Reduction.WINDOW_NORMALIZED,
         fidelity=Fidelity.EXACT, via="worker path", comparable=False,
         note="same normalization issue as policy_loss", source=_OR_ACTOR),
    _row("openrlhf", "ppo_clip_ratio", canonical=CLIP_RATIO, reduction=Reduction.TOKEN_WEIGHTED,
         fidelity=Fidelity.EXACT, via="logger",
         note="local token means weighted by local token counts: exact", source=_OR_ACTOR),
    _row("openrlhf", "ppo_kl", canonical=APPROX_KL, reduction=Reduction.TOKEN_WEIGHTED,
         fidelity=Fidelity.EXACT, via="logger",
         note="k1 of old - new; wrong (equal to vllm_kl) in v0.9.3-v0.10.2 with IS correction",
         source=_OR_ACTOR),
    _row("openrlhf", "vllm_kl", canonical=None, reduction=Reduction.TOKEN_WEIGHTED,
         fidelity=Fidelity.RELAYED, via="logger",
         note="signed k1 of rollout - old log-probs; rlmon's driver hook gives actor/logp_diff "
              "and the IS ratio exactly", source=_OR_ACTOR),
    _row("openrlhf", "is_filter_ratio", canonical=None, reduction=Reduction.TOKEN_WEIGHTED,
         fidelity=Fidelity.RELAYED, via="logger", comparable=False,
         note="logged since v0.11 with IS correction: at is_correction_level=token the fraction "
              "of tokens outside the band (equal to the driver hook's actor/is_masked_frac), at "
              "seq the fraction of sequences, token-weighted over micro-batches", source=_OR_ACTOR),
    _row("openrlhf", "kl", canonical=KL, reduction=Reduction.SAMPLE_WEIGHTED,
         fidelity=Fidelity.EXACT, via="worker path", comparable=False,
         note="sample-weighted in-reward KL, or token-weighted window-normalized KL loss with "
              "kl.use_loss: the same key changes meaning with a flag; the worker path (kl=) pools "
              "the per-token estimator", source=_OR_ACTOR),
    _row("openrlhf", "actor_grad_norm", canonical=GRAD_NORM, reduction=Reduction.LAST,
         fidelity=Fidelity.RECOMPUTED, via="worker path", comparable=False,
         note="OpenRLHF logs the last optimizer step only; the worker path reports every "
              "optimizer step and takes their mean", source=_OR_ACTOR,
         unchecked="the norm comes from DeepspeedStrategy.get_grad_norm on a DeepSpeed engine"),
    _row("openrlhf", "actor_lr", canonical=LR, reduction=Reduction.LAST, fidelity=Fidelity.EXACT,
         via="logger", source=_OR_ACTOR),
    _row("openrlhf", "reward", canonical=REWARD, reduction=Reduction.SAMPLE_WEIGHTED,
         fidelity=Fidelity.EXACT, via="logger", source=_OR_ACTOR, unchecked=_OR_UNCHECKED_TRAIN),
    _row("openrlhf", "response_length", canonical=RESPONSE_LENGTH,
         reduction=Reduction.SAMPLE_WEIGHTED, fidelity=Fidelity.EXACT, via="logger",
         note="a first-to-last action token span (includes tool tokens in multi-turn)",
         source=_OR_ACTOR, unchecked=_OR_UNCHECKED_TRAIN),
    _row("openrlhf", "rollout/reward_mean", canonical=REWARD, reduction=Reduction.DRIVER_EXACT,
         fidelity=Fidelity.EXACT, via="logger", source=_OR_DRIVER, unchecked=_OR_UNCHECKED_DRIVER),
    _row("openrlhf", "rollout/truncated_rate", canonical=CLIPPED_RATIO,
         reduction=Reduction.DRIVER_EXACT, fidelity=Fidelity.EXACT, via="logger", source=_OR_DRIVER,
         unchecked=_OR_UNCHECKED_DRIVER),
    _row("openrlhf", "critic_loss", canonical=CRITIC_LOSS, reduction=Reduction.MEAN_OF_MEANS,
         fidelity=Fidelity.RELAYED, via="logger", comparable=False,
         note="plain mean over ranks and micro-batches", source=_OR_CRITIC),
    _row("openrlhf", "values", canonical=CRITIC_VALUE, reduction=Reduction.MEAN_OF_MEANS,
         fidelity=Fidelity.RELAYED, via="logger", comparable=False,
         note="mean of per-micro-batch means", source=_OR_CRITIC),
    _row("openrlhf", "critic_grad_norm", canonical=CRITIC_GRAD_NORM,
         reduction=Reduction.MEAN_OF_MEANS, fidelity=Fidelity.RELAYED, via="logger",
         comparable=False, note="averaged over micro-batches including stale values",
         source=_OR_CRITIC, unchecked="the norm comes from a DeepSpeed engine"),
    _row("openrlhf", "timing/generation", canonical=GENERATE_SECONDS,
         reduction=Reduction.DRIVER_EXACT, fidelity=Fidelity.EXACT, via="logger", source=_OR_DRIVER,
         unchecked=_TIMER),
    _row("openrlhf", "timing/ppo_train", canonical=TRAIN_SECONDS, reduction=Reduction.DRIVER_EXACT,
         fidelity=Fidelity.EXACT, via="logger", source=_OR_DRIVER, unchecked=_TIMER),
    _row("openrlhf", "timing/broadcast", canonical=WEIGHT_SYNC_SECONDS,
         reduction=Reduction.DRIVER_EXACT, fidelity=Fidelity.EXACT, via="logger", source=_OR_DRIVER,
         unchecked=_TIMER),
    _row("openrlhf", "(not logged) IS ratio", canonical=IS_RATIO, reduction=Reduction.DRIVER_EXACT,
         fidelity=Fidelity.EXACT, via="driver hook",
         note="token mean of exp(old - rollout) over action tokens; PolicyLoss applies it and "
              "discards it", source="openrlhf/models/loss.py"),
    _row("openrlhf", "(not logged) IS ratio min", canonical=IS_RATIO_MIN,
         reduction=Reduction.DRIVER_EXACT, fidelity=Fidelity.EXACT, via="driver hook",
         source="openrlhf/models/loss.py"),
    _row("openrlhf", "(not logged) IS ratio max", canonical=IS_RATIO_MAX,
         reduction=Reduction.DRIVER_EXACT, fidelity=Fidelity.EXACT, via="driver hook",
         source="openrlhf/models/loss.py"),
    _row("openrlhf", "(not logged) logp diff", canonical=LOGP_DIFF,
         reduction=Reduction.DRIVER_EXACT, fidelity=Fidelity.EXACT, via="driver hook",
         note="abs(old - rollout); OpenRLHF's vllm_kl is the signed mean",
         source="openrlhf/models/loss.py"),
    _row("openrlhf", "(not logged) logp diff max", canonical=LOGP_DIFF_MAX,
         reduction=Reduction.DRIVER_EXACT, fidelity=Fidelity.EXACT, via="driver hook",
         source="openrlhf/models/loss.py"),
    _row("openrlhf", "(not logged) IS masked fraction", canonical=IS_MASKED_FRAC,
         reduction=Reduction.DRIVER_EXACT, fidelity=Fidelity.EXACT, via="driver hook",
         note="tokens outside the band (token level: equal to is_filter_ratio; seq-mask-tis: "
              "every token of a sequence whose geometric-mean ratio is outside it)",
         source="openrlhf/models/loss.py"),
    # --- SkyRL (prefixed policy/ and critic/ by the trainer) --------------------------------------
    _row("skyrl", "policy/policy_loss", canonical=LOSS, reduction=Reduction.SUM_DP_MEAN_MINIBATCH,
         fidelity=Fidelity.RECOMPUTED, via="worker path", comparable=False,
         note="masked sum with advantages pre-scaled by loss_reduction; scale depends on the "
              "mode; rlmon reproduces the sum/mean semantics with CP replicas counted once",
         source=_SK_WORKER),
    _row("skyrl", "policy/final_loss", canonical=None, reduction=Reduction.SUM_DP_MEAN_MINIBATCH,
         fidelity=Fidelity.RELAYED, via="tracker", comparable=False,
         note="policy_loss plus the KL and entropy terms", source=_SK_WORKER),
    _row("skyrl", "policy/policy_entropy", canonical=ENTROPY, reduction=Reduction.MEAN_OF_MEANS,
         fidelity=Fidelity.EXACT, via="worker path", comparable=False,
         note="mean of micro-batch means (SkyRL #1822); rlmon pools token sums", source=_SK_WORKER),
    _row("skyrl", "policy/policy_kl", canonical=KL, reduction=Reduction.MEAN_OF_MEANS,
         fidelity=Fidelity.EXACT, via="worker path", comparable=False,
         note="mean over sequences of masked means, then mean of means", source=_SK_WORKER),
    _row("skyrl", "policy/loss_metrics/clip_ratio", canonical=CLIP_RATIO,
         reduction=Reduction.MEAN_OF_MEANS, fidelity=Fidelity.EXACT, via="worker path",
         comparable=False, note="mean of micro-batch means; dual-clip not counted",
         source=_SK_WORKER),
    _row("skyrl", "policy/loss_metrics/is_ratio_mean", canonical=IS_RATIO,
         reduction=Reduction.MEAN_OF_MEANS, fidelity=Fidelity.EXACT, via="worker path",
         comparable=False, note="mean of micro-batch means", source=_SK_WORKER),
    _row("skyrl", "policy/loss_metrics/is_ratio_max", canonical=IS_RATIO_MAX,
         reduction=Reduction.MAX, fidelity=Fidelity.EXACT, via="tracker", source=_SK_WORKER),
    _row("skyrl", "policy/loss_metrics/is_ratio_min", canonical=IS_RATIO_MIN,
         reduction=Reduction.MIN, fidelity=Fidelity.RELAYED, via="tracker", comparable=False,
         note="min of ratio x mask: 0 whenever any position is masked; do not alert on it",
         source=_SK_WORKER),
    _row("skyrl", "policy/grad_norm", canonical=GRAD_NORM, reduction=Reduction.GLOBAL_VALUE,
         fidelity=Fidelity.RELAYED, via="tracker",
         note="pre-clip global norm of the first actor, averaged over optimizer steps by SkyRL: "
              "the canonical definition, forwarded as logged", source=_SK_TRAINER,
         unchecked="the norm comes from the optimizer step of an FSDP/Megatron strategy"),
    _row("skyrl", "policy/policy_lr", canonical=LR, reduction=Reduction.GLOBAL_VALUE,
         fidelity=Fidelity.EXACT, via="tracker", source=_SK_WORKER),
    _row("skyrl", "policy/rollout_train_logprobs_abs_diff_mean", canonical=LOGP_DIFF,
         reduction=Reduction.DRIVER_EXACT, fidelity=Fidelity.EXACT, via="tracker",
         source=_SK_TRAINER),
    _row("skyrl", "policy/rollout_train_logprobs_abs_diff_max", canonical=LOGP_DIFF_MAX,
         reduction=Reduction.DRIVER_EXACT, fidelity=Fidelity.EXACT, via="tracker",
         source=_SK_TRAINER),
    _row("skyrl", "reward/avg_raw_reward", canonical=REWARD, reduction=Reduction.DRIVER_EXACT,
         fidelity=Fidelity.EXACT, via="tracker", source=_SK_TRAINER),
    _row("skyrl", "generate/avg_num_tokens", canonical=RESPONSE_LENGTH,
         reduction=Reduction.DRIVER_EXACT, fidelity=Fidelity.EXACT, via="tracker",
         source="skyrl/train/generators/utils.py"),
    _row("skyrl", "critic/critic_loss", canonical=CRITIC_LOSS, reduction=Reduction.MEAN_OF_MEANS,
         fidelity=Fidelity.RELAYED, via="tracker", comparable=False,
         note="averaged over the whole world and micro-batches", source=_SK_WORKER),
    _row("skyrl", "timing/step", canonical=STEP_SECONDS, reduction=Reduction.DRIVER_EXACT,
         fidelity=Fidelity.EXACT, via="tracker", source=_SK_TRAINER, unchecked=_TIMER),
    # --- verl (0.9 engine workers) ----------------------------------------------------------------
    _row("verl", "actor/pg_loss", canonical=LOSS, reduction=Reduction.SUM_DP_MEAN_MINIBATCH,
         fidelity=Fidelity.RELAYED, via="tracker", comparable=False, note=_VERL_LOSS_NOTE,
         source=_VERL),
    _row("verl", "actor/pg_clipfrac", canonical=CLIP_RATIO, reduction=Reduction.MEAN_OF_MEANS,
         fidelity=Fidelity.RELAYED, via="tracker", comparable=False,
         note="unweighted mean of micro-batch token means (verl #1508)", source=_VERL),
    _row("verl", "actor/ppo_kl", canonical=APPROX_KL, reduction=Reduction.MEAN_OF_MEANS,
         fidelity=Fidelity.RELAYED, via="tracker", comparable=False,
         note="mean of micro-batch means", source=_VERL),
    _row("verl", "actor/entropy", canonical=ENTROPY, reduction=Reduction.DRIVER_EXACT,
         fidelity=Fidelity.RELAYED, via="tracker", comparable=False,
         note="verl 0.9: agg_loss of the recomputed entropies over the whole batch on the driver, "
              "in the actor's loss_agg_mode: the token mean under token-mean, another aggregate "
              "under the seq-mean modes (the update's own is actor/entropy_loss)",
         source="verl/trainer/ppo/ray_trainer.py"),
    _row("verl", "actor/kl_loss", canonical=KL, reduction=Reduction.SUM_DP_MEAN_MINIBATCH,
         fidelity=Fidelity.RELAYED, via="tracker", comparable=False, note=_VERL_LOSS_NOTE,
         source=_VERL),
    _row("verl", "actor/grad_norm", canonical=GRAD_NORM, reduction=Reduction.GLOBAL_VALUE,
         fidelity=Fidelity.RELAYED, via="tracker",
         note="one global norm per optimizer step, averaged by verl: the canonical definition, "
              "forwarded as logged", source=_VERL,
         unchecked="the norm comes from the optimizer step of an FSDP/Megatron engine"),
    _row("verl", "actor/lr", canonical=LR, reduction=Reduction.GLOBAL_VALUE,
         fidelity=Fidelity.EXACT, via="tracker", source=_VERL),
    _row("verl", "critic/score/mean", canonical=REWARD, reduction=Reduction.DRIVER_EXACT,
         fidelity=Fidelity.EXACT, via="tracker", source=_VERL_DATA),
    _row("verl", "response_length/mean", canonical=RESPONSE_LENGTH,
         reduction=Reduction.DRIVER_EXACT, fidelity=Fidelity.EXACT, via="tracker",
         source=_VERL_DATA),
    _row("verl", "response_length/clip_ratio", canonical=CLIPPED_RATIO,
         reduction=Reduction.DRIVER_EXACT, fidelity=Fidelity.EXACT, via="tracker",
         source=_VERL_DATA),
    _row("verl", "rollout_corr/rollout_is_mean", canonical=IS_RATIO,
         reduction=Reduction.MEAN_OF_MEANS, fidelity=Fidelity.RELAYED, via="tracker",
         comparable=False,
         note="the mean of the applied weights (truncated at rollout_is_threshold by TIS, zeroed "
              "out of band by IcePop), not of the ratio; a full-batch token mean in decoupled "
              "mode but a mean of micro-batch means in bypass mode, under the same key",
         source=_VERL_RC),
    _row("verl", "rollout_corr/rollout_is_min", canonical=IS_RATIO_MIN, reduction=Reduction.MIN,
         fidelity=Fidelity.RELAYED, via="tracker", comparable=False,
         note="min of the applied weights: 0 under IcePop; in bypass mode a mean over "
              "micro-batches and DP of per-micro-batch minima", source=_VERL_RC),
    _row("verl", "rollout_corr/rollout_is_max", canonical=IS_RATIO_MAX, reduction=Reduction.MAX,
         fidelity=Fidelity.RELAYED, via="tracker", comparable=False,
         note="max of the applied weights: capped at rollout_is_threshold under TIS; in bypass "
              "mode a mean over micro-batches and DP of per-micro-batch maxima", source=_VERL_RC),
    _row("verl", "training/rollout_probs_diff_mean", canonical=None,
         reduction=Reduction.DRIVER_EXACT, fidelity=Fidelity.RELAYED, via="tracker",
         note="an absolute difference of probabilities, not log-probabilities",
         source="verl/utils/debug/metrics.py"),
    _row("verl", "critic/vf_loss", canonical=CRITIC_LOSS, reduction=Reduction.SUM_DP_MEAN_MINIBATCH,
         fidelity=Fidelity.RELAYED, via="tracker", comparable=False, note=_VERL_LOSS_NOTE,
         source=_VERL),
    _row("verl", "timing_s/step", canonical=STEP_SECONDS, reduction=Reduction.DRIVER_EXACT,
         fidelity=Fidelity.EXACT, via="tracker", source=_VERL_DATA, unchecked=_TIMER),
    # --- TRL (GRPOTrainer, TRL 1.16: on_log keys, and the hooks of RlmonCallback.attach) ------
    # TRL 1.x ships no PPOTrainer; other trainers' keys are relayed under trl/<key>.
    _row("trl", "loss", canonical=LOSS, reduction=Reduction.WINDOW_MEAN, fidelity=Fidelity.RELAYED,
         via="callback", comparable=False,
         note="HF Trainer loss averaged over the logging window, scaled per loss_type",
         source=_TRL),
    _row("trl", "grad_norm", canonical=GRAD_NORM, reduction=Reduction.GLOBAL_VALUE,
         fidelity=Fidelity.EXACT, via="callback", note="the step's pre-clip global norm",
         source=_TRL),
    _row("trl", "learning_rate", canonical=LR, reduction=Reduction.GLOBAL_VALUE,
         fidelity=Fidelity.EXACT, via="callback", source=_TRL),
    _row("trl", "reward", canonical=REWARD, reduction=Reduction.WINDOW_MEAN,
         fidelity=Fidelity.EXACT, via="trainer hook",
         note="rlmon pools the gathered rewards of _calculate_rewards (NaN-aware); TRL's nanmean "
              "per generation batch, averaged over the window, is the same for equal batches",
         source=_TRL),
    _row("trl", "reward_std", canonical=REWARD_STD, reduction=Reduction.WINDOW_MEAN,
         fidelity=Fidelity.EXACT, via="trainer hook", comparable=False,
         note="TRL logs the Bessel-corrected (sample) std of each generation batch, averaged over "
              "the logging window; rlmon sends (n, sum, sum of squares) of the gathered rewards: "
              "rollout/reward_std is the population std of the step, sqrt((n-1)/n) times the "
              "sample one (3 % lower with 16 rewards, 0.8 % with 64)", source=_TRL),
    _row("trl", "(not logged) reward min", canonical=REWARD_MIN, reduction=Reduction.MIN,
         fidelity=Fidelity.EXACT, via="trainer hook", note="min of the gathered rewards",
         source=_TRL),
    _row("trl", "(not logged) reward max", canonical=REWARD_MAX, reduction=Reduction.MAX,
         fidelity=Fidelity.EXACT, via="trainer hook", note="max of the gathered rewards",
         source=_TRL),
    _row("trl", "(not logged) samples", canonical=SAMPLES, reduction=Reduction.DRIVER_EXACT,
         fidelity=Fidelity.EXACT, via="trainer hook",
         note="completions scored in the step: the gathered rewards' count", source=_TRL),
    _row("trl", "(not logged) tokens", canonical=TOKENS, reduction=Reduction.WINDOW_MEAN,
         fidelity=Fidelity.RECOMPUTED, via="trainer hook",
         note="completion tokens of the step: each batch's completions/mean_length (over the "
              "gathered lengths) times its size", source=_TRL),
    _row("trl", "frac_reward_zero_std", canonical=FRAC_REWARD_ZERO_STD,
         reduction=Reduction.WINDOW_MEAN, fidelity=Fidelity.EXACT, via="callback",
         note="a share of the gathered batch; batches are of equal size, so the window mean is "
              "exact", source=_TRL),
    _row("trl", "completions/mean_length", canonical=RESPONSE_LENGTH,
         reduction=Reduction.WINDOW_MEAN, fidelity=Fidelity.EXACT, via="callback",
         note="gathered lengths, equal-size batches", source=_TRL),
    _row("trl", "completions/max_length", canonical=RESPONSE_LENGTH_MAX,
         reduction=Reduction.WINDOW_MEAN, fidelity=Fidelity.EXACT, via="trainer hook",
         comparable=False,
         note="TRL averages the per-batch maxima over the logging window; rlmon takes the max of "
              "the trainer's per-batch values", source=_TRL),
    _row("trl", "completions/clipped_ratio", canonical=CLIPPED_RATIO,
         reduction=Reduction.WINDOW_MEAN, fidelity=Fidelity.EXACT, via="callback",
         note="gathered, equal-size batches", source=_TRL),
    _row("trl", "entropy", canonical=ENTROPY, reduction=Reduction.MEAN_OF_MEANS,
         fidelity=Fidelity.EXACT, via="trainer hook", comparable=False,
         note="a global masked mean per micro-batch (PR #6380), then the mean over the step's "
              "micro-batches; rlmon pools the (sum, count) pairs _compute_loss reduces",
         source=_TRL),
    _row("trl", "kl", canonical=KL, reduction=Reduction.MEAN_OF_MEANS, fidelity=Fidelity.EXACT,
         via="trainer hook", comparable=False,
         note="k3 to the reference (beta != 0); mean of micro-batch means; rlmon pools the pairs",
         source=_TRL),
    _row("trl", "clip_ratio/region_mean", canonical=CLIP_RATIO, reduction=Reduction.MEAN_OF_MEANS,
         fidelity=Fidelity.EXACT, via="trainer hook", comparable=False,
         note="mean of micro-batch means; rlmon pools the pairs", source=_TRL),
    _row("trl", "clip_ratio/low_mean", canonical=None, reduction=Reduction.MEAN_OF_MEANS,
         fidelity=Fidelity.RELAYED, via="callback", comparable=False,
         note="ordinary lower clip (not verl's dual-clip pg_clipfrac_lower); mean of micro-batch "
              "means", source=_TRL),
    _row("trl", "clip_ratio/high_mean", canonical=None, reduction=Reduction.MEAN_OF_MEANS,
         fidelity=Fidelity.RELAYED, via="callback", comparable=False,
         note="mean of micro-batch means", source=_TRL),
    _row("trl", "clip_ratio/low_min", canonical=None, reduction=Reduction.WINDOW_MEAN,
         fidelity=Fidelity.RELAYED, via="callback", comparable=False,
         note="a window mean of per-micro-batch minima", source=_TRL),
    _row("trl", "clip_ratio/high_max", canonical=None, reduction=Reduction.WINDOW_MEAN,
         fidelity=Fidelity.RELAYED, via="callback", comparable=False,
         note="a window mean of per-micro-batch maxima", source=_TRL),
    _row("trl", "sampling/sampling_logp_difference/mean", canonical=LOGP_DIFF,
         reduction=Reduction.MEAN_OF_RANK_MEANS, fidelity=Fidelity.RELAYED, via="callback",
         comparable=False, note="per-rank token means, then averaged over ranks", source=_TRL,
         unchecked=_TRL_VLLM),
    _row("trl", "sampling/sampling_logp_difference/max", canonical=LOGP_DIFF_MAX,
         reduction=Reduction.WINDOW_MEAN, fidelity=Fidelity.RELAYED, via="callback",
         comparable=False,
         note="a global max per batch, then averaged over the logging window by Trainer.log: a "
              "mean of maxima, not the window's max", source=_TRL, unchecked=_TRL_VLLM),
    _row("trl", "sampling/importance_sampling_ratio/mean", canonical=IS_RATIO,
         reduction=Reduction.MEAN_OF_RANK_MEANS, fidelity=Fidelity.RELAYED, via="callback",
         comparable=False,
         note="logged after truncation or masking (TRL #5231), mean of rank means", source=_TRL,
         unchecked=_TRL_VLLM),
    _row("trl", "sampling/importance_sampling_ratio/min", canonical=IS_RATIO_MIN,
         reduction=Reduction.MIN, fidelity=Fidelity.RELAYED, via="callback", comparable=False,
         note="after masking: 0 whenever sequence_mask fired", source=_TRL, unchecked=_TRL_VLLM),
    _row("trl", "sampling/importance_sampling_ratio/max", canonical=IS_RATIO_MAX,
         reduction=Reduction.WINDOW_MEAN, fidelity=Fidelity.RELAYED, via="callback",
         comparable=False, note="capped under truncation, and a window mean of per-batch maxima",
         source=_TRL, unchecked=_TRL_VLLM),
    # --- vLLM (per-engine stat logger) ------------------------------------------------------------
    _row("vllm", "SchedulerStats.num_running_reqs", canonical=NUM_RUNNING_REQS,
         reduction=Reduction.ENGINE_COUNTERS, fidelity=Fidelity.EXACT, via="stat logger",
         note="per engine the mean over its scheduler iterations in the step, summed over engines "
              "(the last sample of a window reads 0 after a batch)", source=_VLLM),
    _row("vllm", "SchedulerStats.num_running_reqs (max)", canonical=NUM_RUNNING_REQS_MAX,
         reduction=Reduction.MAX, fidelity=Fidelity.EXACT, via="stat logger",
         note="the largest sample of any engine in the step", source=_VLLM),
    _row("vllm", "SchedulerStats.num_waiting_reqs", canonical=NUM_WAITING_REQS,
         reduction=Reduction.ENGINE_COUNTERS, fidelity=Fidelity.EXACT, via="stat logger",
         note="as num_running_reqs", source=_VLLM),
    _row("vllm", "SchedulerStats.num_waiting_reqs (max)", canonical=NUM_WAITING_REQS_MAX,
         reduction=Reduction.MAX, fidelity=Fidelity.EXACT, via="stat logger", source=_VLLM),
    _row("vllm", "SchedulerStats.kv_cache_usage", canonical=KV_CACHE_USAGE,
         reduction=Reduction.ENGINE_COUNTERS, fidelity=Fidelity.EXACT, via="stat logger",
         note="mean over every engine's scheduler iterations in the step", source=_VLLM),
    _row("vllm", "SchedulerStats.kv_cache_usage (max)", canonical=KV_CACHE_USAGE_MAX,
         reduction=Reduction.MAX, fidelity=Fidelity.EXACT, via="stat logger", source=_VLLM),
    _row("vllm", "IterationStats.num_preempted_reqs", canonical=PREEMPTIONS,
         reduction=Reduction.ENGINE_COUNTERS, fidelity=Fidelity.EXACT, via="stat logger",
         source=_VLLM),
    _row("vllm", "PrefixCacheStats.hits/queries", canonical=PREFIX_CACHE_HIT_RATE,
         reduction=Reduction.ENGINE_COUNTERS, fidelity=Fidelity.RECOMPUTED, via="stat logger",
         note="hits over queries pooled over engines (not a mean of engine rates)", source=_VLLM),
    _row("vllm", "IterationStats.num_generation_tokens", canonical=TOKENS,
         reduction=Reduction.ENGINE_COUNTERS, fidelity=Fidelity.EXACT, via="stat logger",
         note="summed over iterations and engines; equal to vLLM's own vllm:generation_tokens "
              "counter", source=_VLLM),
    _row("vllm", "IterationStats.num_generation_tokens (rate)", canonical=TOKENS_PER_SECOND,
         reduction=Reduction.ENGINE_COUNTERS, fidelity=Fidelity.RECOMPUTED, via="stat logger",
         note="per engine the tokens generated between its first and last iteration of the step "
              "over that span, summed over engines", source=_VLLM),
    # --- DeepSpeed (engine probe) -----------------------------------------------------------------
    _row("deepspeed", "loss_scale", canonical=LOSS_SCALE, reduction=Reduction.GLOBAL_VALUE,
         fidelity=Fidelity.EXACT, via="engine probe", source=_DS),
    _row("deepspeed", "skipped_steps", canonical=SKIPPED_STEPS, reduction=Reduction.GLOBAL_VALUE,
         fidelity=Fidelity.EXACT, via="engine probe", source=_DS),
    _row("deepspeed", "global_grad_norm", canonical=GRAD_NORM, reduction=Reduction.GLOBAL_VALUE,
         fidelity=Fidelity.EXACT, via="engine probe",
         note="NaN under DeepSpeed 0.13.5-0.14.0 is a known bug", source=_DS),
    _row("deepspeed", "loss", canonical=LOSS, reduction=Reduction.LOSS_SCALED_BY_GAS,
         fidelity=Fidelity.RECOMPUTED, via="engine probe", comparable=False,
         note="engine.backward scales the loss by 1/gradient_accumulation_steps; the probe takes "
              "the forward loss (loss=) or DeepSpeed's scaled one (scaled_loss=) and reports "
              "actor/loss in the plain scale", source=_DS),
)

FRAMEWORKS: tuple[str, ...] = ("openrlhf", "skyrl", "verl", "trl", "vllm", "deepspeed")

_BY_KEY: Mapping[tuple[str, str], KeyMapping] = MappingProxyType(
    {(row.framework, row.key): row for row in _ROWS}
)


def mappings(framework: str | None = None) -> Iterator[KeyMapping]:
    """The rows of one framework (or all), in declaration order."""
    if framework is not None and framework not in FRAMEWORKS:
        raise KeyError(f"unknown framework {framework!r} (known: {', '.join(FRAMEWORKS)})")
    return (row for row in _ROWS if framework is None or row.framework == framework)


def by_key(framework: str, key: str) -> KeyMapping | None:
    """The row for one logged key, or None when rlmon has no mapping for it."""
    return _BY_KEY.get((framework, key))


def canonical(framework: str, key: str) -> str | None:
    """The canonical name a key may be published under, or None (relay it under its own name)."""
    row = by_key(framework, key)
    if row is None or row.canonical is None or not row.comparable:
        return None
    return row.canonical


def relay_name(framework: str, key: str) -> str:
    """The name a relayed, non-canonical key is published under: ``<framework>/<key>``."""
    return f"{framework}/{key}"


def keymap_json(framework: str | None = None) -> list[dict[str, Any]]:
    return [
        {
            "framework": row.framework,
            "key": row.key,
            "canonical": row.canonical,
            "framework_reduction": row.reduction.value,
            "rlmon": row.fidelity.value,
            "via": row.via,
            "comparable_across_runs": row.comparable,
            "note": row.note,
            "source": row.source,
            "unchecked": row.unchecked,
        }
        for row in mappings(framework)
    ]


def keymap_markdown(framework: str | None = None) -> str:
    lines = ["| framework | key | canonical | framework reduction | rlmon | via | note |",
             "|---|---|---|---|---|---|---|"]
    for row in mappings(framework):
        canon = f"`{row.canonical}`" if row.canonical else "-"
        note = row.note if row.comparable else f"not comparable across runs: {row.note}"
        lines.append(
            f"| {row.framework} | `{row.key}` | {canon} | {row.reduction.value} | "
            f"{row.fidelity.value} | {row.via} | {note} |"
        )
    return "\n".join(lines) + "\n"


_RANK = {Fidelity.EXACT: 0, Fidelity.RECOMPUTED: 1, Fidelity.RELAYED: 2}


def fidelity_matrix() -> dict[str, dict[str, Fidelity]]:
    """canonical metric -> framework -> the best fidelity rlmon reaches for it."""
    matrix: dict[str, dict[str, Fidelity]] = {}
    for row in _ROWS:
        if row.canonical is None:
            continue
        cell = matrix.setdefault(row.canonical, {})
        held = cell.get(row.framework)
        if held is None or _RANK[row.fidelity] < _RANK[held]:
            cell[row.framework] = row.fidelity
    return matrix


def unchecked_cells() -> dict[tuple[str, str], list[KeyMapping]]:
    """(canonical, framework) cells of the matrix whose every best-fidelity row is unchecked."""
    matrix = fidelity_matrix()
    cells: dict[tuple[str, str], list[KeyMapping]] = {}
    for row in _ROWS:
        if row.canonical is not None and matrix[row.canonical][row.framework] is row.fidelity:
            cells.setdefault((row.canonical, row.framework), []).append(row)
    return {cell: rows for cell, rows in cells.items() if all(r.unchecked for r in rows)}


def matrix_markdown() -> str:
    """The key matrix of docs/integrations.md: canonical metrics x frameworks, marked exact /
    recomputed / relayed; ``*`` marks a claim no test checks against the framework
    (:func:`unchecked_markdown`)."""
    matrix = fidelity_matrix()
    unchecked = unchecked_cells()
    lines = ["| metric | " + " | ".join(FRAMEWORKS) + " |",
             "|---|" + "---|" * len(FRAMEWORKS)]
    for spec in catalog.metrics():
        cell = matrix.get(spec.name)
        if not cell:
            continue
        marks = [cell[fw].value + ("*" if (spec.name, fw) in unchecked else "")
                 if fw in cell else "" for fw in FRAMEWORKS]
        lines.append(f"| `{spec.name}` | " + " | ".join(marks) + " |")
    return "\n".join(lines) + "\n"


def unchecked_markdown() -> str:
    """Why each ``*`` cell of the matrix is not checked against the framework's functions."""
    lines = ["`*` not checked against the framework's own functions:", ""]
    for (canon, fw), rows in sorted(unchecked_cells().items(), key=lambda c: (c[0][1], c[0][0])):
        why = "; ".join(dict.fromkeys(r.unchecked for r in rows))
        keys = ", ".join(f"`{r.key}`" for r in rows)
        lines.append(f"- {fw} `{canon}` ({keys}): {why}")
    return "\n".join(lines) + "\n"


def artifacts() -> list[Any]:
    """The framework tables of docs/integrations.md, kept fresh by ``rlmon generate``."""
    from rlmon.service.artifact import Artifact

    return [Artifact("docs/integrations.md", matrix_markdown, block="frameworks"),
            Artifact("docs/integrations.md", unchecked_markdown, block="frameworks-unchecked")]
