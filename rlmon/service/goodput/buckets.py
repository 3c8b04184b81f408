"""Where a span's time goes: the four goodput buckets and the span-name map.

A span is named by the code that timed it (``rep.span("update_actor")``). Its name maps to an
:class:`Activity` (generation, training, a forward-only pass, weight sync, ...), and the activity
to a :class:`Bucket`: productive work, overhead (needed, but no learning: weight sync,
checkpoints, evaluation, logging), or neither (``step``: a container whose time falls to the
spans inside it). Idle and wasted time are never declared by a span: they are derived from the
timelines and the step's metrics (:mod:`rlmon.service.goodput.accounting`).

The default map holds the phase names of the frameworks rlmon integrates with (verl's
``marked_timer`` phases, SkyRL's ``Timer`` names, OpenRLHF's timing keys, TRL's profiling blocks,
DeepSpeed's engine timers, the demo's spans); ``goodput.spans`` in the config adds to it or
overrides an entry. docs/goodput.md has the table.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

__all__ = ["ACTIVITY_BUCKET", "DEFAULT_SPANS", "Activity", "Bucket", "SpanMap"]


class Bucket(StrEnum):
    PRODUCTIVE = "productive"
    OVERHEAD = "overhead"
    IDLE = "idle"
    WASTED = "wasted"


class Activity(StrEnum):
    """What a span does; its value is the ``reason`` label of the time it classifies."""

    GENERATE = "generate"  # rollout generation (vLLM, HF generate)
    TRAIN = "train"  # forward/backward/optimizer of an update
    INFERENCE = "inference"  # forward-only passes: old log-probs, reference, values, reward model
    WEIGHT_SYNC = "weight_sync"
    CHECKPOINT = "checkpoint"
    EVALUATION = "evaluation"
    LOGGING = "logging"
    STEP = "step"  # a container: its time falls to the spans inside it, the rest is idle
    OTHER = "other"  # a name the map does not know (bucket: goodput.unmapped_bucket)


ACTIVITY_BUCKET: Mapping[Activity, Bucket | None] = {
    Activity.GENERATE: Bucket.PRODUCTIVE,
    Activity.TRAIN: Bucket.PRODUCTIVE,
    Activity.INFERENCE: Bucket.PRODUCTIVE,
    Activity.WEIGHT_SYNC: Bucket.OVERHEAD,
    Activity.CHECKPOINT: Bucket.OVERHEAD,
    Activity.EVALUATION: Bucket.OVERHEAD,
    Activity.LOGGING: Bucket.OVERHEAD,
    Activity.STEP: None,
    Activity.OTHER: Bucket.PRODUCTIVE,
}

_A = Activity
# (framework, span name, activity): the documented default map (docs/goodput.md prints it).
DEFAULT_SPANS: tuple[tuple[str, str, Activity], ...] = (
    ("demo", "generate", _A.GENERATE),
    ("demo", "train", _A.TRAIN),
    ("demo", "reward", _A.INFERENCE),
    ("demo", "weight_sync", _A.WEIGHT_SYNC),
    # verl: marked_timer phases of RayPPOTrainer.fit (timing_s/<phase>)
    ("verl", "gen", _A.GENERATE),
    ("verl", "gen_max", _A.GENERATE),
    ("verl", "old_log_prob", _A.INFERENCE),
    ("verl", "ref", _A.INFERENCE),
    ("verl", "values", _A.INFERENCE),
    ("verl", "adv", _A.INFERENCE),
    ("verl", "update_critic", _A.TRAIN),
    ("verl", "update_actor", _A.TRAIN),
    ("verl", "update_weights", _A.WEIGHT_SYNC),
    ("verl", "save_checkpoint", _A.CHECKPOINT),
    ("verl", "testing", _A.EVALUATION),
    ("verl", "start_profile", _A.LOGGING),
    ("verl", "stop_profile", _A.LOGGING),
    ("verl", "step", _A.STEP),
    # SkyRL: Timer(name, self.all_timings) in the trainer (timing/<name>)
    ("skyrl", "generate", _A.GENERATE),
    ("skyrl", "postprocess_generator_output", _A.LOGGING),
    ("skyrl", "convert_to_training_input", _A.LOGGING),
    ("skyrl", "fwd_logprobs_values_reward", _A.INFERENCE),
    ("skyrl", "apply_reward_kl_penalty", _A.INFERENCE),
    ("skyrl", "compute_advantages_and_returns", _A.INFERENCE),
    ("skyrl", "train_critic_and_policy", _A.TRAIN),
    ("skyrl", "critic_train", _A.TRAIN),
    ("skyrl", "policy_train", _A.TRAIN),
    ("skyrl", "sync_weights", _A.WEIGHT_SYNC),
    ("skyrl", "update_ref_with_policy", _A.WEIGHT_SYNC),
    ("skyrl", "save_checkpoints", _A.CHECKPOINT),
    ("skyrl", "cleanup_old_checkpoints", _A.CHECKPOINT),
    ("skyrl", "save_hf_model", _A.CHECKPOINT),
    ("skyrl", "eval", _A.EVALUATION),
    ("skyrl", "eval_generate", _A.EVALUATION),
    # OpenRLHF: the PPO trainer's timing/<name> keys
    ("openrlhf", "generation", _A.GENERATE),
    ("openrlhf", "make_experience", _A.INFERENCE),
    ("openrlhf", "ppo_train", _A.TRAIN),
    ("openrlhf", "broadcast", _A.WEIGHT_SYNC),
    # TRL: profiling_context blocks of GRPOTrainer ("profiling/Time taken: GRPOTrainer.<block>")
    ("trl", "vllm.generate", _A.GENERATE),
    ("trl", "transformers.generate", _A.GENERATE),
    ("trl", "transformers.generate_batch", _A.GENERATE),
    ("trl", "_calculate_rewards", _A.INFERENCE),
    ("trl", "_compute_loss", _A.TRAIN),
    ("trl", "training_step", _A.TRAIN),
    # vLLM: the calls a rollout worker times (LLM.generate, LLM.chat, the weight load)
    ("vllm", "llm.generate", _A.GENERATE),
    ("vllm", "llm.chat", _A.GENERATE),
    ("vllm", "load_weights", _A.WEIGHT_SYNC),
    # DeepSpeed: the engine's wall-clock timers (global and per micro-step)
    ("deepspeed", "fwd", _A.TRAIN),
    ("deepspeed", "bwd", _A.TRAIN),
    ("deepspeed", "bwd_inner", _A.TRAIN),
    ("deepspeed", "bwd_allreduce", _A.TRAIN),
    ("deepspeed", "fwd_microstep", _A.TRAIN),
    ("deepspeed", "bwd_microstep", _A.TRAIN),
    ("deepspeed", "bwd_inner_microstep", _A.TRAIN),
    ("deepspeed", "bwd_allreduce_microstep", _A.TRAIN),
    ("deepspeed", "step_microstep", _A.TRAIN),
    ("deepspeed", "forward", _A.TRAIN),
    ("deepspeed", "backward", _A.TRAIN),
    ("deepspeed", "optimizer_step", _A.TRAIN),
    # common names (any framework)
    ("common", "rollout", _A.GENERATE),
    ("common", "generation", _A.GENERATE),
    ("common", "reference", _A.INFERENCE),
    ("common", "ref_logprobs", _A.INFERENCE),
    ("common", "old_logprobs", _A.INFERENCE),
    ("common", "critic", _A.INFERENCE),
    ("common", "update", _A.TRAIN),
    ("common", "optimizer", _A.TRAIN),
    ("common", "checkpoint", _A.CHECKPOINT),
    ("common", "save", _A.CHECKPOINT),
    ("common", "evaluate", _A.EVALUATION),
    ("common", "evaluation", _A.EVALUATION),
    ("common", "validation", _A.EVALUATION),
    ("common", "logging", _A.LOGGING),
    ("common", "log", _A.LOGGING),
)

_PREFIXES = ("timing/", "timing_s/", "profiling/time taken: ")
_MAX_CACHED = 10_000  # distinct span names remembered (the rest are looked up each time)


class SpanMap:
    """Span name -> :class:`Activity`: the default map, then ``overrides`` (name -> activity).

    Names match without case; a framework's timing prefix (``timing_s/``, ``timing/``,
    ``profiling/Time taken: ``) and a class prefix (``GRPOTrainer.``) are ignored when the
    whole name is not in the map. A name it does not know is :attr:`Activity.OTHER`.
    """

    def __init__(self, overrides: Mapping[str, Activity | str] | None = None,
                 unmapped: Bucket = Bucket.PRODUCTIVE) -> None:
        if unmapped not in (Bucket.PRODUCTIVE, Bucket.OVERHEAD):
            raise ValueError(f"goodput.unmapped_bucket must be productive or overhead, "
                             f"got {unmapped!r}")
        self.unmapped = Bucket(unmapped)
        self._names: dict[str, Activity] = {name: activity
                                            for _fw, name, activity in DEFAULT_SPANS}
        for name, activity in (overrides or {}).items():
            try:
                self._names[name.lower()] = Activity(activity)
            except ValueError:
                raise ValueError(f"goodput.spans.{name}: unknown activity {activity!r} (one of "
                                 f"{', '.join(a.value for a in Activity)})") from None
        self._cache: dict[str, Activity] = {}

    def activity(self, name: str) -> Activity:
        found = self._cache.get(name)
        if found is not None:
            return found
        found = self._lookup(name.lower())
        if len(self._cache) < _MAX_CACHED:
            self._cache[name] = found
        return found

    def _lookup(self, key: str) -> Activity:
        names = self._names
        if key in names:
            return names[key]
        for prefix in _PREFIXES:
            if key.startswith(prefix):
                key = key[len(prefix):]
                if key in names:
                    return names[key]
        while "." in key:  # GRPOTrainer.vLLM.generate -> vllm.generate -> generate
            key = key.split(".", 1)[1]
            if key in names:
                return names[key]
        return Activity.OTHER

    def bucket(self, activity: Activity) -> Bucket | None:
        """The activity's bucket (None for a container)."""
        if activity is Activity.OTHER:
            return self.unmapped
        return ACTIVITY_BUCKET[activity]
