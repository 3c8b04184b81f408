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


R, F = Reduction, Fidelity
TW, SW, MOM, LAST = R.TOKEN_WEIGHTED, R.SAMPLE_WEIGHTED, R.MEAN_OF_MEANS, R.LAST
EXACT, RECOMP, RELAY = F.EXACT, F.RECOMPUTED, F.RELAYED

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


def _m(fw: str, key: str, canon: str | None, red: Reduction, fid: Fidelity, via: str,
       comparable: bool = True, note: str = "", source: str = "",
       unchecked: str = "") -> KeyMapping:
    canonical = catalog.get(canon).name if canon else None  # KeyError at import if unknown
    return KeyMapping(fw, key, canonical, red, fid, via, comparable, note, source, unchecked)


_ROWS: tuple[KeyMapping, ...] = (
    # --- OpenRLHF (status keys; W&B/TB prefix them with train/) ----------------------------------
    _m("openrlhf", "policy_loss", LOSS, R.WINDOW_NORMALIZED, EXACT, "worker path", False,
       "a per-micro-batch contribution normalized by the window's global token count, then "
       "token-weighted again: biased under uneven token counts, about 1/micro-batches in "
       "dynamic-batch mode; rlmon recomputes the token mean from raw masked sums", _OR_ACTOR),
    _m("openrlhf", "entropy_loss", ENTROPY, R.WINDOW_NORMALIZED, EXACT, "worker path", False,
       "same normalization issue as policy_loss", _OR_ACTOR),
    _m("openrlhf", "ppo_clip_ratio", CLIP_RATIO, TW, EXACT, "logger",
       note="local token means weighted by local token counts: exact", source=_OR_ACTOR),
    _m("openrlhf", "ppo_kl", APPROX_KL, TW, EXACT, "logger",
       note="k1 of old - new; wrong (equal to vllm_kl) in v0.9.3-v0.10.2 with IS correction",
       source=_OR_ACTOR),
    _m("openrlhf", "vllm_kl", None, TW, RELAY, "logger",
       note="signed k1 of rollout - old log-probs; rlmon's driver hook gives actor/logp_diff "
       "and the IS ratio exactly", source=_OR_ACTOR),
    _m("openrlhf", "is_filter_ratio", None, TW, RELAY, "logger", False,
       "logged since v0.11 with IS correction: at is_correction_level=token the fraction of "
       "tokens outside the band (equal to the driver hook's actor/is_masked_frac), at seq the "
       "fraction of sequences, token-weighted over micro-batches", _OR_ACTOR),
    _m("openrlhf", "kl", KL, SW, EXACT, "worker path", False,
       "sample-weighted in-reward KL, or token-weighted window-normalized KL loss with "
       "kl.use_loss: the same key changes meaning with a flag; the worker path (kl=) pools "
       "the per-token estimator", _OR_ACTOR),
    _m("openrlhf", "actor_grad_norm", GRAD_NORM, LAST, RECOMP, "worker path", False,
       "OpenRLHF logs the last optimizer step only; the worker path reports every optimizer "
       "step and takes their mean", _OR_ACTOR,
       unchecked="the norm comes from DeepspeedStrategy.get_grad_norm on a DeepSpeed engine"),
    _m("openrlhf", "actor_lr", LR, LAST, EXACT, "logger", source=_OR_ACTOR),
    _m("openrlhf", "reward", REWARD, SW, EXACT, "logger", source=_OR_ACTOR,
       unchecked=_OR_UNCHECKED_TRAIN),
    _m("openrlhf", "response_length", RESPONSE_LENGTH, SW, EXACT, "logger",
       note="a first-to-last action token span (includes tool tokens in multi-turn)",
       source=_OR_ACTOR, unchecked=_OR_UNCHECKED_TRAIN),
    _m("openrlhf", "rollout/reward_mean", REWARD, R.DRIVER_EXACT, EXACT, "logger",
       source=_OR_DRIVER, unchecked=_OR_UNCHECKED_DRIVER),
    _m("openrlhf", "rollout/truncated_rate", CLIPPED_RATIO, R.DRIVER_EXACT, EXACT, "logger",
       source=_OR_DRIVER, unchecked=_OR_UNCHECKED_DRIVER),
    _m("openrlhf", "critic_loss", CRITIC_LOSS, MOM, RELAY, "logger", False,
       "plain mean over ranks and micro-batches", _OR_CRITIC),
    _m("openrlhf", "values", CRITIC_VALUE, MOM, RELAY, "logger", False,
       "mean of per-micro-batch means", _OR_CRITIC),
    _m("openrlhf", "critic_grad_norm", CRITIC_GRAD_NORM, MOM, RELAY, "logger", False,
       "averaged over micro-batches including stale values", _OR_CRITIC,
       unchecked="the norm comes from a DeepSpeed engine"),
    _m("openrlhf", "timing/generation", GENERATE_SECONDS, R.DRIVER_EXACT, EXACT, "logger",
       source=_OR_DRIVER, unchecked=_TIMER),
    _m("openrlhf", "timing/ppo_train", TRAIN_SECONDS, R.DRIVER_EXACT, EXACT, "logger",
       source=_OR_DRIVER, unchecked=_TIMER),
    _m("openrlhf", "timing/broadcast", WEIGHT_SYNC_SECONDS, R.DRIVER_EXACT, EXACT, "logger",
       source=_OR_DRIVER, unchecked=_TIMER),
    _m("openrlhf", "(not logged) IS ratio", IS_RATIO, R.DRIVER_EXACT, EXACT, "driver hook",
       note="token mean of exp(old - rollout) over action tokens; PolicyLoss applies it and "
       "discards it", source="openrlhf/models/loss.py"),
    _m("openrlhf", "(not logged) IS ratio min", IS_RATIO_MIN, R.DRIVER_EXACT, EXACT,
       "driver hook", source="openrlhf/models/loss.py"),
    _m("openrlhf", "(not logged) IS ratio max", IS_RATIO_MAX, R.DRIVER_EXACT, EXACT,
       "driver hook", source="openrlhf/models/loss.py"),
    _m("openrlhf", "(not logged) logp diff", LOGP_DIFF, R.DRIVER_EXACT, EXACT, "driver hook",
       note="abs(old - rollout); OpenRLHF's vllm_kl is the signed mean",
       source="openrlhf/models/loss.py"),
    _m("openrlhf", "(not logged) logp diff max", LOGP_DIFF_MAX, R.DRIVER_EXACT, EXACT,
       "driver hook", source="openrlhf/models/loss.py"),
    _m("openrlhf", "(not logged) IS masked fraction", IS_MASKED_FRAC, R.DRIVER_EXACT, EXACT,
       "driver hook", note="tokens outside the band (token level: equal to is_filter_ratio; "
       "seq-mask-tis: every token of a sequence whose geometric-mean ratio is outside it)",
       source="openrlhf/models/loss.py"),
    # --- SkyRL (prefixed policy/ and critic/ by the trainer) --------------------------------------
    _m("skyrl", "policy/policy_loss", LOSS, R.SUM_DP_MEAN_MINIBATCH, RECOMP, "worker path",
       False, "masked sum with advantages pre-scaled by loss_reduction; scale depends on "
       "the mode; rlmon reproduces the sum/mean semantics with CP replicas counted once",
       _SK_WORKER),
    _m("skyrl", "policy/final_loss", None, R.SUM_DP_MEAN_MINIBATCH, RELAY, "tracker", False,
       "policy_loss plus the KL and entropy terms", _SK_WORKER),
    _m("skyrl", "policy/policy_entropy", ENTROPY, MOM, EXACT, "worker path", False,
       "mean of micro-batch means (SkyRL #1822); rlmon pools token sums", _SK_WORKER),
    _m("skyrl", "policy/policy_kl", KL, MOM, EXACT, "worker path", False,
       "mean over sequences of masked means, then mean of means", _SK_WORKER),
    _m("skyrl", "policy/loss_metrics/clip_ratio", CLIP_RATIO, MOM, EXACT, "worker path", False,
       "mean of micro-batch means; dual-clip not counted", _SK_WORKER),
    _m("skyrl", "policy/loss_metrics/is_ratio_mean", IS_RATIO, MOM, EXACT, "worker path", False,
       "mean of micro-batch means", _SK_WORKER),
    _m("skyrl", "policy/loss_metrics/is_ratio_max", IS_RATIO_MAX, R.MAX, EXACT, "tracker",
       source=_SK_WORKER),
    _m("skyrl", "policy/loss_metrics/is_ratio_min", IS_RATIO_MIN, R.MIN, RELAY, "tracker", False,
       "min of ratio x mask: 0 whenever any position is masked; do not alert on it", _SK_WORKER),
    _m("skyrl", "policy/grad_norm", GRAD_NORM, R.GLOBAL_VALUE, RELAY, "tracker",
       note="pre-clip global norm of the first actor, averaged over optimizer steps by SkyRL: "
       "the canonical definition, forwarded as logged", source=_SK_TRAINER,
       unchecked="the norm comes from the optimizer step of an FSDP/Megatron strategy"),
    _m("skyrl", "policy/policy_lr", LR, R.GLOBAL_VALUE, EXACT, "tracker", source=_SK_WORKER),
    _m("skyrl", "policy/rollout_train_logprobs_abs_diff_mean", LOGP_DIFF, R.DRIVER_EXACT, EXACT,
       "tracker", source=_SK_TRAINER),
    _m("skyrl", "policy/rollout_train_logprobs_abs_diff_max", LOGP_DIFF_MAX, R.DRIVER_EXACT,
       EXACT, "tracker", source=_SK_TRAINER),
    _m("skyrl", "reward/avg_raw_reward", REWARD, R.DRIVER_EXACT, EXACT, "tracker",
       source=_SK_TRAINER),
    _m("skyrl", "generate/avg_num_tokens", RESPONSE_LENGTH, R.DRIVER_EXACT, EXACT, "tracker",
       source="skyrl/train/generators/utils.py"),
    _m("skyrl", "critic/critic_loss", CRITIC_LOSS, MOM, RELAY, "tracker", False,
       "averaged over the whole world and micro-batches", _SK_WORKER),
    _m("skyrl", "timing/step", STEP_SECONDS, R.DRIVER_EXACT, EXACT, "tracker",
       source=_SK_TRAINER, unchecked=_TIMER),
    # --- verl (0.9 engine workers) ----------------------------------------------------------------------
    _m("verl", "actor/pg_loss", LOSS, R.SUM_DP_MEAN_MINIBATCH, RELAY, "tracker", False,
       _VERL_LOSS_NOTE, _VERL),
    _m("verl", "actor/pg_clipfrac", CLIP_RATIO, MOM, RELAY, "tracker", False,
       "unweighted mean of micro-batch token means (verl #1508)", _VERL),
    _m("verl", "actor/ppo_kl", APPROX_KL, MOM, RELAY, "tracker", False,
       "mean of micro-batch means", _VERL),
    _m("verl", "actor/entropy", ENTROPY, R.DRIVER_EXACT, RELAY, "tracker", False,
       "verl 0.9: agg_loss of the recomputed entropies over the whole batch on the driver, in "
       "the actor's loss_agg_mode: the token mean under token-mean, another aggregate under "
       "the seq-mean modes (the update's own is actor/entropy_loss)",
       "verl/trainer/ppo/ray_trainer.py"),
    _m("verl", "actor/kl_loss", KL, R.SUM_DP_MEAN_MINIBATCH, RELAY, "tracker", False,
       _VERL_LOSS_NOTE, _VERL),
    _m("verl", "actor/grad_norm", GRAD_NORM, R.GLOBAL_VALUE, RELAY, "tracker",
       note="one global norm per optimizer step, averaged by verl: the canonical definition, "
       "forwarded as logged", source=_VERL,
       unchecked="the norm comes from the optimizer step of an FSDP/Megatron engine"),
    _m("verl", "actor/lr", LR, R.GLOBAL_VALUE, EXACT, "tracker", source=_VERL),
    _m("verl", "critic/score/mean", REWARD, R.DRIVER_EXACT, EXACT, "tracker", source=_VERL_DATA),
    _m("verl", "response_length/mean", RESPONSE_LENGTH, R.DRIVER_EXACT, EXACT, "tracker",
       source=_VERL_DATA),
    _m("verl", "response_length/clip_ratio", CLIPPED_RATIO, R.DRIVER_EXACT, EXACT, "tracker",
       source=_VERL_DATA),
    _m("verl", "rollout_corr/rollout_is_mean", IS_RATIO, MOM, RELAY, "tracker", False,
       "the mean of the applied weights (truncated at rollout_is_threshold by TIS, zeroed out "
       "of band by IcePop), not of the ratio; a full-batch token mean in decoupled mode but a "
       "mean of micro-batch means in bypass mode, under the same key", _VERL_RC),
    _m("verl", "rollout_corr/rollout_is_min", IS_RATIO_MIN, R.MIN, RELAY, "tracker", False,
       "min of the applied weights: 0 under IcePop; in bypass mode a mean over micro-batches "
       "and DP of per-micro-batch minima", _VERL_RC),
    _m("verl", "rollout_corr/rollout_is_max", IS_RATIO_MAX, R.MAX, RELAY, "tracker", False,
       "max of the applied weights: capped at rollout_is_threshold under TIS; in bypass mode "
       "a mean over micro-batches and DP of per-micro-batch maxima", _VERL_RC),
    _m("verl", "training/rollout_probs_diff_mean", None, R.DRIVER_EXACT, RELAY, "tracker",
       note="an absolute difference of probabilities, not log-probabilities",
       source="verl/utils/debug/metrics.py"),
    _m("verl", "critic/vf_loss", CRITIC_LOSS, R.SUM_DP_MEAN_MINIBATCH, RELAY, "tracker", False,
       _VERL_LOSS_NOTE, _VERL),
    _m("verl", "timing_s/step", STEP_SECONDS, R.DRIVER_EXACT, EXACT, "tracker",
       source=_VERL_DATA, unchecked=_TIMER),
    # --- TRL (GRPOTrainer, TRL 1.16: on_log keys, and the hooks of RlmonCallback.attach) ------
    # TRL 1.x ships no PPOTrainer; other trainers' keys are relayed under trl/<key>.
    _m("trl", "loss", LOSS, R.WINDOW_MEAN, RELAY, "callback", False,
       "HF Trainer loss averaged over the logging window, scaled per loss_type", _TRL),
    _m("trl", "grad_norm", GRAD_NORM, R.GLOBAL_VALUE, EXACT, "callback",
       note="the step's pre-clip global norm", source=_TRL),
    _m("trl", "learning_rate", LR, R.GLOBAL_VALUE, EXACT, "callback", source=_TRL),
    _m("trl", "reward", REWARD, R.WINDOW_MEAN, EXACT, "trainer hook",
       note="rlmon pools the gathered rewards of _calculate_rewards (NaN-aware); TRL's nanmean "
       "per generation batch, averaged over the window, is the same for equal batches",
       source=_TRL),
    _m("trl", "reward_std", REWARD_STD, R.WINDOW_MEAN, EXACT, "trainer hook", False,
       "TRL logs the Bessel-corrected (sample) std of each generation batch, averaged over the "
       "logging window; rlmon sends (n, sum, sum of squares) of the gathered rewards: the "
       "population std of the step", _TRL),
    _m("trl", "(not logged) reward min", REWARD_MIN, R.MIN, EXACT, "trainer hook",
       note="min of the gathered rewards", source=_TRL),
    _m("trl", "(not logged) reward max", REWARD_MAX, R.MAX, EXACT, "trainer hook",
       note="max of the gathered rewards", source=_TRL),
    _m("trl", "(not logged) samples", SAMPLES, R.DRIVER_EXACT, EXACT, "trainer hook",
       note="completions scored in the step: the gathered rewards' count", source=_TRL),
    _m("trl", "(not logged) tokens", TOKENS, R.WINDOW_MEAN, RECOMP, "trainer hook",
       note="completion tokens of the step: each batch's completions/mean_length (over the "
       "gathered lengths) times its size", source=_TRL),
    _m("trl", "frac_reward_zero_std", FRAC_REWARD_ZERO_STD, R.WINDOW_MEAN, EXACT, "callback",
       note="a share of the gathered batch; batches are of equal size, so the window mean is "
       "exact", source=_TRL),
    _m("trl", "completions/mean_length", RESPONSE_LENGTH, R.WINDOW_MEAN, EXACT, "callback",
       note="gathered lengths, equal-size batches", source=_TRL),
    _m("trl", "completions/max_length", RESPONSE_LENGTH_MAX, R.WINDOW_MEAN, EXACT,
       "trainer hook", False, "TRL averages the per-batch maxima over the logging window; "
       "rlmon takes the max of the trainer's per-batch values", _TRL),
    _m("trl", "completions/clipped_ratio", CLIPPED_RATIO, R.WINDOW_MEAN, EXACT, "callback",
       note="gathered, equal-size batches", source=_TRL),
    _m("trl", "entropy", ENTROPY, MOM, EXACT, "trainer hook", False,
       "a global masked mean per micro-batch (PR #6380), then the mean over the step's "
       "micro-batches; rlmon pools the (sum, count) pairs _compute_loss reduces", _TRL),
    _m("trl", "kl", KL, MOM, EXACT, "trainer hook", False,
       "k3 to the reference (beta != 0); mean of micro-batch means; rlmon pools the pairs", _TRL),
    _m("trl", "clip_ratio/region_mean", CLIP_RATIO, MOM, EXACT, "trainer hook", False,
       "mean of micro-batch means; rlmon pools the pairs", _TRL),
    _m("trl", "clip_ratio/low_mean", None, MOM, RELAY, "callback", False,
       "ordinary lower clip (not verl's dual-clip pg_clipfrac_lower); mean of micro-batch "
       "means", _TRL),
    _m("trl", "clip_ratio/high_mean", None, MOM, RELAY, "callback", False,
       "mean of micro-batch means", _TRL),
    _m("trl", "clip_ratio/low_min", None, R.WINDOW_MEAN, RELAY, "callback", False,
       "a window mean of per-micro-batch minima", _TRL),
    _m("trl", "clip_ratio/high_max", None, R.WINDOW_MEAN, RELAY, "callback", False,
       "a window mean of per-micro-batch maxima", _TRL),
    _m("trl", "sampling/sampling_logp_difference/mean", LOGP_DIFF, R.MEAN_OF_RANK_MEANS, RELAY,
       "callback", False, "per-rank token means, then averaged over ranks", _TRL,
       unchecked=_TRL_VLLM),
    _m("trl", "sampling/sampling_logp_difference/max", LOGP_DIFF_MAX, R.WINDOW_MEAN, RELAY,
       "callback", False, "a global max per batch, then averaged over the logging window by "
       "Trainer.log: a mean of maxima, not the window's max", _TRL, unchecked=_TRL_VLLM),
    _m("trl", "sampling/importance_sampling_ratio/mean", IS_RATIO, R.MEAN_OF_RANK_MEANS, RELAY,
       "callback", False, "logged after truncation or masking (TRL #5231), mean of rank means",
       _TRL, unchecked=_TRL_VLLM),
    _m("trl", "sampling/importance_sampling_ratio/min", IS_RATIO_MIN, R.MIN, RELAY, "callback",
       False, "after masking: 0 whenever sequence_mask fired", _TRL, unchecked=_TRL_VLLM),
    _m("trl", "sampling/importance_sampling_ratio/max", IS_RATIO_MAX, R.WINDOW_MEAN, RELAY,
       "callback", False, "capped under truncation, and a window mean of per-batch maxima",
       _TRL, unchecked=_TRL_VLLM),
    # --- vLLM (per-engine stat logger) --------------------------------------------------------------
    _m("vllm", "SchedulerStats.num_running_reqs", NUM_RUNNING_REQS, R.ENGINE_COUNTERS, EXACT,
       "stat logger", note="per engine the mean over its scheduler iterations in the step, "
       "summed over engines (the last sample of a window reads 0 after a batch)", source=_VLLM),
    _m("vllm", "SchedulerStats.num_running_reqs (max)", NUM_RUNNING_REQS_MAX, R.MAX, EXACT,
       "stat logger", note="the largest sample of any engine in the step", source=_VLLM),
    _m("vllm", "SchedulerStats.num_waiting_reqs", NUM_WAITING_REQS, R.ENGINE_COUNTERS, EXACT,
       "stat logger", note="as num_running_reqs", source=_VLLM),
    _m("vllm", "SchedulerStats.num_waiting_reqs (max)", NUM_WAITING_REQS_MAX, R.MAX, EXACT,
       "stat logger", source=_VLLM),
    _m("vllm", "SchedulerStats.kv_cache_usage", KV_CACHE_USAGE, R.ENGINE_COUNTERS, EXACT,
       "stat logger", note="mean over every engine's scheduler iterations in the step",
       source=_VLLM),
    _m("vllm", "SchedulerStats.kv_cache_usage (max)", KV_CACHE_USAGE_MAX, R.MAX, EXACT,
       "stat logger", source=_VLLM),
    _m("vllm", "IterationStats.num_preempted_reqs", PREEMPTIONS, R.ENGINE_COUNTERS, EXACT,
       "stat logger", source=_VLLM),
    _m("vllm", "PrefixCacheStats.hits/queries", PREFIX_CACHE_HIT_RATE, R.ENGINE_COUNTERS, RECOMP,
       "stat logger", note="hits over queries pooled over engines (not a mean of engine rates)",
       source=_VLLM),
    _m("vllm", "IterationStats.num_generation_tokens", TOKENS, R.ENGINE_COUNTERS, EXACT,
       "stat logger", note="summed over iterations and engines; equal to vLLM's own "
       "vllm:generation_tokens counter", source=_VLLM),
    _m("vllm", "IterationStats.num_generation_tokens (rate)", TOKENS_PER_SECOND,
       R.ENGINE_COUNTERS, RECOMP, "stat logger", note="per engine the tokens generated between "
       "its first and last iteration of the step over that span, summed over engines",
       source=_VLLM),
    # --- DeepSpeed (engine probe) -----------------------------------------------------------------------
    _m("deepspeed", "loss_scale", LOSS_SCALE, R.GLOBAL_VALUE, EXACT, "engine probe",
       source=_DS),
    _m("deepspeed", "skipped_steps", SKIPPED_STEPS, R.GLOBAL_VALUE, EXACT, "engine probe",
       source=_DS),
    _m("deepspeed", "global_grad_norm", GRAD_NORM, R.GLOBAL_VALUE, EXACT, "engine probe",
       note="NaN under DeepSpeed 0.13.5-0.14.0 is a known bug", source=_DS),
    _m("deepspeed", "loss", LOSS, R.LOSS_SCALED_BY_GAS, RECOMP, "engine probe", False,
       "engine.backward scales the loss by 1/gradient_accumulation_steps; the probe takes the "
       "forward loss (loss=) or DeepSpeed's scaled one (scaled_loss=) and reports actor/loss "
       "in the plain scale", _DS),
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
    from rlmon.service.generated import Artifact

    return [Artifact("docs/integrations.md", matrix_markdown, block="frameworks"),
            Artifact("docs/integrations.md", unchecked_markdown, block="frameworks-unchecked")]
