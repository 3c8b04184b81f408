"""What to change, per framework: each alert's configuration keys and their typical ranges.

Data, like the catalog. An alert's what-to-check line says what to look at; a remedy says which
knob of the run's own framework moves it, spelled as that framework spells it (verl's Hydra
paths, OpenRLHF's command-line flags, SkyRL's config paths, TRL's ``GRPOConfig`` fields) with the
range people use, and in plain words for a home-grown loop. Every key names the file of the
framework's package that defines it (``source``, checked against the installed package by
``tests/frameworks/test_frameworks_remedies.py``; versions in :data:`CHECKED_AGAINST`). The
docs table (docs/alerting.md, "What to change") is generated from here.

Alerts that no configuration key fixes (a dead rank, a stall, a replica mismatch) have no
remedy; their what-to-check line stands alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["CHECKED_AGAINST", "CUSTOM", "FRAMEWORKS", "REMEDIES", "Knob", "Remedy",
           "artifacts", "framework_of", "remedy_for", "remedy_text", "table_markdown"]

CUSTOM = "custom"  # a home-grown loop: plain words, no keys
FRAMEWORKS: tuple[str, ...] = ("verl", "openrlhf", "skyrl", "trl")
CHECKED_AGAINST: Mapping[str, str] = {
    "verl": "0.9.1", "openrlhf": "0.11.2", "skyrl": "0.3.0", "trl": "1.16.0",
    "transformers": "5.x"}

_VERL = "verl/trainer/config/_generated_ppo_trainer.yaml"
_VERL_ASYNC = "verl/experimental/fully_async_policy/config/fully_async_ppo_trainer.yaml"
_ORLHF = "openrlhf/cli/train_ppo_ray.py"
_SKYRL = "skyrl/train/config/config.py"
_TRL = "trl/trainer/grpo_config.py"
_HF = "transformers/training_args.py"  # GRPOConfig inherits TrainingArguments


@dataclass(frozen=True, slots=True)
class Knob:
    """One configuration key: how to move it and the range people use."""

    key: str  # as the framework spells it: a Hydra path, a CLI flag, a config field
    change: str  # "raise", "lower", "set", "enable"
    typical: str  # the value or range, in the framework's terms
    source: str  # the package file that defines the key (path from the package's top)

    def describe(self) -> str:
        return f"{self.change} `{self.key}` ({self.typical})"


@dataclass(frozen=True, slots=True)
class Remedy:
    """What to change for a group of alerts that share a cause."""

    alerts: tuple[str, ...]
    plain: str  # the custom loop's words (and the first sentence for every framework)
    knobs: Mapping[str, tuple[Knob, ...]]  # framework -> keys, in the order to try them


def _k(key: str, change: str, typical: str, source: str) -> Knob:
    return Knob(key, change, typical, source)


REMEDIES: tuple[Remedy, ...] = (
    Remedy(
        ("ClipRatioHigh", "ClipRatioClimbing"),
        "Each update moves the policy too far: lower the learning rate (1e-7 to 1e-6 for RL on "
        "an LLM) or the passes over each batch (1).",
        {"verl": (_k("actor_rollout_ref.actor.optim.lr", "lower", "1e-7 to 1e-6", _VERL),
                  _k("actor_rollout_ref.actor.ppo_epochs", "lower", "1", _VERL)),
         "openrlhf": (_k("--actor.adam.lr", "lower", "1e-7 to 1e-6", _ORLHF),
                      _k("--train.max_epochs", "lower", "1", _ORLHF)),
         "skyrl": (_k("trainer.policy.optimizer_config.lr", "lower", "1e-7 to 1e-6", _SKYRL),
                   _k("trainer.update_epochs_per_batch", "lower", "1", _SKYRL)),
         "trl": (_k("learning_rate", "lower", "1e-7 to 1e-6", _TRL),
                 _k("num_iterations", "lower", "1", _TRL))}),
    Remedy(
        ("EntropyCollapse", "EntropySliding"),
        "The policy is sharpening too fast: sample at temperature 1.0, let the upper clip bound "
        "rise (clip-higher: ~0.28, the lower one at 0.2), or add a small entropy bonus "
        "(1e-4 to 1e-3).",
        {"verl": (_k("actor_rollout_ref.rollout.temperature", "raise", "to 1.0", _VERL),
                  _k("actor_rollout_ref.actor.clip_ratio_high", "raise",
                     "to ~0.28, clip_ratio_low at 0.2", _VERL),
                  _k("actor_rollout_ref.actor.entropy_coeff", "raise", "0 to 1e-3", _VERL)),
         "openrlhf": (_k("--rollout.temperature", "raise", "to 1.0", _ORLHF),
                      _k("--actor.eps_clip_low_high", "set", "0.2 0.28", _ORLHF),
                      _k("--actor.entropy_coef", "raise", "0 to 1e-3", _ORLHF)),
         "skyrl": (_k("generator.sampling_params.temperature", "raise", "to 1.0", _SKYRL),
                   _k("trainer.algorithm.eps_clip_high", "raise",
                      "to ~0.28, eps_clip_low at 0.2", _SKYRL),
                   _k("trainer.algorithm.entropy_loss_coef", "set",
                      "1e-4 to 1e-3, with use_entropy_loss=true", _SKYRL)),
         "trl": (_k("temperature", "raise", "to 1.0", _TRL),
                 _k("epsilon_high", "raise", "to ~0.28, epsilon at 0.2", _TRL))}),
    Remedy(
        ("KLDivergence", "KLClimbing"),
        "The policy drifts from the reference faster than the KL penalty holds it: raise the KL "
        "coefficient (1e-3 to 1e-2) or lower the learning rate.",
        {"verl": (_k("actor_rollout_ref.actor.kl_loss_coef", "raise",
                     "1e-3 to 1e-2, with use_kl_loss=True", _VERL),
                  _k("algorithm.kl_ctrl.kl_coef", "raise",
                     "1e-3 to 1e-2, with use_kl_in_reward=True", _VERL)),
         "openrlhf": (_k("--algo.kl.init_coef", "raise", "1e-3 to 1e-2", _ORLHF),
                      _k("--actor.adam.lr", "lower", "1e-7 to 1e-6", _ORLHF)),
         "skyrl": (_k("trainer.algorithm.kl_loss_coef", "raise",
                      "1e-3 to 1e-2, with use_kl_loss=true", _SKYRL),
                   _k("trainer.policy.optimizer_config.lr", "lower", "1e-7 to 1e-6", _SKYRL)),
         "trl": (_k("beta", "raise", "1e-3 to 4e-2 (0 turns the KL term off)", _TRL),
                 _k("learning_rate", "lower", "1e-7 to 1e-6", _TRL))}),
    Remedy(
        ("GradNormHigh", "GradNormBlowingUp", "NonFiniteMetric"),
        "Clip the gradient (max norm 1.0), lower the learning rate or lengthen its warm-up "
        "(3-10% of the steps); a NaN with a calm gradient before it is a NaN input (a reward, an "
        "advantage over a group of one).",
        {"verl": (_k("actor_rollout_ref.actor.grad_clip", "set", "1.0", _VERL),
                  _k("actor_rollout_ref.actor.optim.lr_warmup_steps_ratio", "raise",
                     "0.03 to 0.1", _VERL)),
         "openrlhf": (_k("--actor.max_norm", "set", "1.0", _ORLHF),
                      _k("--actor.lr_warmup_ratio", "raise", "0.03 to 0.1", _ORLHF)),
         "skyrl": (_k("trainer.policy.optimizer_config.max_grad_norm", "set", "1.0", _SKYRL),
                   _k("trainer.policy.optimizer_config.num_warmup_steps", "raise",
                      "3-10% of the steps", _SKYRL)),
         "trl": (_k("max_grad_norm", "set", "1.0", _HF),
                 _k("warmup_steps", "raise", "0.03 to 0.1 (a float below 1 is a ratio)", _HF))}),
    Remedy(
        ("ISRatioDivergence", "ISRatioStale", "LogprobMismatch", "LogprobDivergence",
         "LogprobMismatchClimbing"),
        "The rollout engine samples from other weights than the trainer scores: check the weight "
        "sync first (every step's weights loaded, none skipped), then the rollout engine's "
        "precision; correct what remains with truncated importance sampling (cap 2 to 5).",
        {"verl": (_k("algorithm.rollout_correction.rollout_is", "set", "token", _VERL),
                  _k("algorithm.rollout_correction.rollout_is_threshold", "set", "2 to 5",
                     _VERL)),
         "openrlhf": (_k("--algo.advantage.is_correction_level", "set", "token", _ORLHF),
                      _k("--algo.advantage.is_correction_threshold", "set", "0.5 5.0", _ORLHF),
                      _k("--vllm.sync_backend", "check", "nccl", _ORLHF)),
         "skyrl": (_k("trainer.algorithm.off_policy_correction.tis_ratio_type", "set", "token",
                      _SKYRL),
                   _k("trainer.algorithm.off_policy_correction.token_tis_ratio_clip_high", "set",
                      "1.5 to 5", _SKYRL),
                   _k("generator.inference_engine.weight_sync_backend", "check", "nccl",
                      _SKYRL)),
         "trl": (_k("vllm_importance_sampling_correction", "keep", "True", _TRL),
                 _k("vllm_importance_sampling_clip_max", "set", "2 to 5 (default 3.0)", _TRL))}),
    Remedy(
        ("NoLearningSignal", "LearningSignalFading"),
        "Most prompt groups score alike and teach nothing: drop or resample the tied groups "
        "(dynamic sampling), sample more completions per prompt (8 to 16), and check the prompts' "
        "difficulty and the reward function.",
        {"verl": (_k("algorithm.filter_groups.enable", "set", "True", _VERL),
                  _k("actor_rollout_ref.rollout.n", "raise", "8 to 16", _VERL)),
         "openrlhf": (_k("--algo.dynamic_filtering_enable", "set", "(a flag)", _ORLHF),
                      _k("--rollout.n_samples_per_prompt", "raise", "8 to 16", _ORLHF)),
         "skyrl": (_k("trainer.algorithm.dynamic_sampling.type", "set", "filter", _SKYRL),
                   _k("generator.n_samples_per_prompt", "raise", "8 to 16", _SKYRL)),
         "trl": (_k("num_generations", "raise", "8 to 16", _TRL),
                 _k("temperature", "raise", "to 1.0", _TRL))}),
    Remedy(
        ("RewardStuck", "RewardCollapsing"),
        "Check the reward function before the policy: an answer parser that fails on every "
        "output, a remote reward server answering a constant, a changed data set.",
        {"verl": (_k("reward.custom_reward_function.path", "check", "the function's file",
                     _VERL),
                  _k("reward.reward_manager.name", "check", "naive, dapo, ...", _VERL)),
         "openrlhf": (_k("--reward.remote_url", "check", "the reward server answers", _ORLHF),),
         "skyrl": (_k("environment.env_class", "check", "the environment's reward", _SKYRL),),
         "trl": (_k("reward_weights", "check", "one per reward function", _TRL),)}),
    Remedy(
        ("RewardHacking",),
        "The policy found a loophole in the reward: read the highest-reward completions first, "
        "then close it in the reward (penalize padding, repetition, the format it games), hold "
        "the policy nearer the reference (KL coefficient 1e-3 to 1e-2) and cap the length.",
        {"verl": (_k("reward.custom_reward_function.path", "fix", "the function's loophole",
                     _VERL),
                  _k("actor_rollout_ref.actor.kl_loss_coef", "raise",
                     "1e-3 to 1e-2, with use_kl_loss=True", _VERL),
                  _k("data.max_response_length", "lower", "to what the answers need", _VERL)),
         "openrlhf": (_k("--reward.remote_url", "fix", "the reward server's loophole", _ORLHF),
                      _k("--algo.kl.init_coef", "raise", "1e-3 to 1e-2", _ORLHF),
                      _k("--reward.overlong_buffer_len", "set", "~20% of the limit", _ORLHF)),
         "skyrl": (_k("environment.env_class", "fix", "the environment's reward", _SKYRL),
                   _k("trainer.algorithm.kl_loss_coef", "raise",
                      "1e-3 to 1e-2, with use_kl_loss=true", _SKYRL),
                   _k("generator.sampling_params.max_generate_length", "lower",
                      "to what the answers need", _SKYRL)),
         "trl": (_k("reward_weights", "check", "one per reward function", _TRL),
                 _k("beta", "raise", "1e-3 to 4e-2", _TRL),
                 _k("max_completion_length", "lower", "to what the answers need", _TRL))}),
    Remedy(
        ("CompletionsTruncated", "ResponseLengthRunaway"),
        "Completions run into the generation limit: raise the limit if the answers need it, "
        "else penalize or mask overlong completions (DAPO's overlong shaping).",
        {"verl": (_k("data.max_response_length", "raise", "to what the answers need", _VERL),
                  _k("actor_rollout_ref.rollout.response_length", "raise",
                     "with data.max_response_length", _VERL)),
         "openrlhf": (_k("--rollout.max_new_tokens", "raise", "to what the answers need", _ORLHF),
                      _k("--reward.overlong_buffer_len", "set", "~20% of the limit", _ORLHF)),
         "skyrl": (_k("generator.sampling_params.max_generate_length", "raise",
                      "to what the answers need", _SKYRL),
                   _k("generator.apply_overlong_filtering", "set", "true", _SKYRL)),
         "trl": (_k("max_completion_length", "raise", "to what the answers need", _TRL),
                 _k("mask_truncated_completions", "set", "True", _TRL))}),
    Remedy(
        ("PolicyLagGrowing",),
        "Rollouts come from ever older weights: bound their staleness (1 to 2 steps) or sync the "
        "weights more often.",
        {"verl": (_k("async_training.staleness_threshold", "lower", "0 to 0.5", _VERL_ASYNC),
                  _k("async_training.trigger_parameter_sync_step", "lower", "1 to 4",
                     _VERL_ASYNC)),
         "openrlhf": (_k("--train.async_queue_size", "lower", "1 to 2", _ORLHF),),
         "skyrl": (_k("trainer.fully_async.max_staleness_steps", "lower", "1 to 4", _SKYRL),),
         "trl": (_k("steps_per_generation", "lower",
                    "to gradient_accumulation_steps (each generation used once)", _TRL),)}),
)

_BY_ALERT: dict[str, Remedy] = {alert: r for r in REMEDIES for alert in r.alerts}


def framework_of(name: str | None) -> str:
    """The remedies' framework for a run's framework name ("" or unknown: the custom loop)."""
    name = (name or "").strip().lower()
    return name if name in FRAMEWORKS else CUSTOM


def remedy_for(alert: str) -> Remedy | None:
    return _BY_ALERT.get(alert)


def remedy_text(alert: str, framework: str | None) -> str:
    """What to change, for the alert, in the framework's keys (its plain words for a home-grown
    loop or a framework rlmon has no keys for); "" when no key fixes the alert."""
    remedy = _BY_ALERT.get(alert)
    if remedy is None:
        return ""
    fw = framework_of(framework)
    knobs = remedy.knobs.get(fw, ())
    if not knobs:
        return remedy.plain
    return f"{remedy.plain} {_LABEL[fw]}: " + "; ".join(k.describe() for k in knobs) + "."


_LABEL = {"verl": "verl", "openrlhf": "OpenRLHF", "skyrl": "SkyRL", "trl": "TRL"}


def table_markdown() -> str:
    """The docs table: one row per alert group, one column per framework."""
    head = "| alerts | your own loop | " + " | ".join(_LABEL[f] for f in FRAMEWORKS) + " |"
    rows = [head, "|" + "---|" * (len(FRAMEWORKS) + 2)]
    for remedy in REMEDIES:
        cells = [", ".join(f"`{a}`" for a in remedy.alerts), remedy.plain]
        for fw in FRAMEWORKS:
            cells.append("<br>".join(
                f"{k.change} `{k.key}` ({k.typical})".replace("|", "\\|")
                for k in remedy.knobs.get(fw, ())))
        rows.append("| " + " | ".join(cells) + " |")
    versions = ", ".join(f"{fw} {v}" for fw, v in CHECKED_AGAINST.items())
    sources = sorted({k.source for r in REMEDIES for ks in r.knobs.values() for k in ks})
    return ("\n".join(rows) + f"\n\nKey names checked against the packages' source ({versions}): "
            + ", ".join(f"`{s}`" for s in sources) + ".\n")


def artifacts() -> list[Any]:
    """The docs table (``rlmon generate``)."""
    from rlmon.service.artifact import Artifact

    return [Artifact("docs/alerting.md", table_markdown, block="remedies")]
