"""The run's settings a log file carries, read from the config the writer recorded with it.

The signatures of a scaling bug (a loss divided by the gradient-accumulation steps, a token
count summed over context-parallel ranks) can only be told from a healthy change of level
against the settings: W&B keeps the run config in its transaction log, the Hugging Face
TensorBoard callback writes its arguments as a text summary, a checkpoint keeps them in
``training_args.bin``. Each setting keeps where it was read (docs/diagnose.md lists them).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass, field, fields
from typing import Any

from rlmon.service.contract.run_info import RunInfo
from rlmon.service.json_input import loads as bounded_json

__all__ = ["RunSettings", "Segment", "flatten", "settings_from_config"]

# Each setting and the config keys that hold it (the last dotted component, or a full path).
_INT_KEYS: dict[str, tuple[str, ...]] = {
    # Hugging Face TrainingArguments, DeepSpeed's config, Megatron, OpenRLHF, verl
    "gradient_accumulation_steps": ("gradient_accumulation_steps",),
    "per_device_batch_size": ("per_device_train_batch_size", "train_micro_batch_size_per_gpu",
                              "micro_train_batch_size", "ppo_micro_batch_size_per_gpu"),
    "world_size": ("world_size",),
    "context_parallel": ("context_parallel_size", "cp_size", "ring_attn_size"),
    "sequence_parallel": ("ulysses_sequence_parallel_size", "sequence_parallel_size"),
    "zero_stage": ("zero_optimization.stage", "zero_stage"),
}
_LENGTH = ("max_seq_length", "max_len", "max_length")
_PROMPT_LENGTH = ("max_prompt_length",)
_COMPLETION_LENGTH = ("max_completion_length", "max_response_length", "generate_max_len")
_TRAIN_BATCH = ("data.train_batch_size",)  # verl: prompts per step, each sampled rollout.n times
_SAMPLES_PER_PROMPT = ("actor_rollout_ref.rollout.n",)
_GPUS = ("trainer.n_gpus_per_node",)
_NODES = ("trainer.nnodes",)

# The largest value each setting can plausibly hold: a value past it (a 600-digit world size, a
# 1e300) is refused by name, never used to price or scale anything.
_MOST = {"gradient_accumulation_steps": 1 << 20, "per_device_batch_size": 1 << 24,
         "world_size": 1 << 20, "context_parallel": 1 << 16, "sequence_parallel": 1 << 16,
         "zero_stage": 3, "max_length": 1 << 31, "samples_per_step": 1 << 40}
_MOST_FACTOR = {_LENGTH: 1 << 31, _PROMPT_LENGTH: 1 << 31, _COMPLETION_LENGTH: 1 << 31,
                _TRAIN_BATCH: 1 << 30, _SAMPLES_PER_PROMPT: 1 << 16, _GPUS: 1 << 12,
                _NODES: 1 << 20}
_MAX_DIGITS = 20  # an integer written with more digits is past every bound above


@dataclass(frozen=True, slots=True)
class RunSettings:
    """What the run was configured with; None where the files do not say."""

    gradient_accumulation_steps: int | None = None
    per_device_batch_size: int | None = None
    world_size: int | None = None  # processes training together
    context_parallel: int | None = None
    sequence_parallel: int | None = None
    max_length: int | None = None  # the longest sequence a sample can have (prompt + answer)
    zero_stage: int | None = None
    deepspeed: bool | None = None
    samples_per_step: int | None = None  # the whole step's samples, where the config says so
    origin: tuple[tuple[str, str], ...] = ()  # (setting, where it was read)
    refused: tuple[str, ...] = ()  # values out of their setting's range, by key (not used)

    @property
    def known(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name not in ("origin", "refused") and getattr(self, f.name) is not None}

    @property
    def data_parallel(self) -> int | None:
        """The ranks holding distinct samples: the world over the context- and
        sequence-parallel ranks that share each sample."""
        if self.world_size is None:
            return None
        shared = (self.context_parallel or 1) * (self.sequence_parallel or 1)
        return max(1, self.world_size // shared)

    def tokens_per_step_at_most(self) -> tuple[int, str] | None:
        """The most distinct tokens one optimizer step can hold, and how it is reckoned, where
        every factor is known."""
        if self.samples_per_step is not None and self.max_length is not None:
            return (self.samples_per_step * self.max_length,
                    f"{self.samples_per_step} samples x {self.max_length} tokens")
        parts = (self.per_device_batch_size, self.gradient_accumulation_steps,
                 self.data_parallel, self.max_length)
        if any(p is None for p in parts):
            return None
        out = 1
        for part in parts:
            out *= int(part or 0)
        return out, (f"per-device batch {parts[0]} x GA {parts[1]} x data-parallel {parts[2]} "
                     f"x {parts[3]} tokens")

    def to_run_info(self, framework: str = "", dpo: bool = False,
                    deepspeed_version: str = "") -> RunInfo:
        """The service's run metadata, so the sanity checks are built as the service builds
        them (``ServiceCore.set_run_info``)."""
        return RunInfo(framework=framework, dp=self.data_parallel, cp=self.context_parallel,
                       grad_accumulation=self.gradient_accumulation_steps,
                       zero_stage=self.zero_stage, deepspeed_version=deepspeed_version,
                       dpo=dpo)

    def to_json(self) -> dict[str, Any]:
        return {**self.known, "read_from": dict(self.origin), "refused": list(self.refused)}

    def describe(self) -> str:
        known = ", ".join(f"{k}={v}" for k, v in self.known.items())
        if not self.refused:
            return known
        return "; ".join(([known] if known else []) + [f"refused {r}" for r in self.refused])


@dataclass(frozen=True, slots=True)
class Segment:
    """A stretch of the run written by one process (a restart begins a new one)."""

    first_step: int
    settings: RunSettings
    source: str
    # the whole config recorded, flattened to dotted keys (``rlmon diff`` compares two runs')
    config: Mapping[str, Any] = field(default_factory=dict)


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested config as dotted keys; W&B's ``{"value": x}`` wrappers unwrapped."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, Mapping) and "value" in value and set(value) <= {"value", "desc"}:
            value = value["value"]
        if isinstance(value, str) and value[:1] == "{":
            with suppress(ValueError):  # the HF arguments keep a DeepSpeed config as JSON
                value = bounded_json(value)
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _int(value: Any) -> int | float | None:
    """An integer setting's value; a float too large to be one is kept as the float (it is
    refused by range, never converted: ``int(1e300)`` is a 301-digit number)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and (value.is_integer() or math.isinf(value)):
        return int(value) if abs(value) < 2.0 ** 63 else value
    if isinstance(value, str) and value.strip().isdigit():
        digits = value.strip()
        return int(digits) if len(digits) <= _MAX_DIGITS else math.inf
    return None


def _shown(number: int | float) -> str:
    text = f"{number:g}" if isinstance(number, float) else str(number)
    return text if len(text) <= 24 else f"{text[:12]}... ({len(text)} digits)"


def _find_bounded(flat: Mapping[str, Any], names: tuple[str, ...], most: int,
          refused: list[str]) -> tuple[str, int] | None:
    """The first key ending in one of ``names`` with a positive integer value up to ``most``:
    the shortest path first, the actor's before a critic's (verl nests one config per role).
    A value past ``most`` is named in ``refused``."""
    hits = []
    for key, value in flat.items():
        number = _int(value)
        if number is None or number <= 0:
            continue
        for rank, name in enumerate(names):
            if key == name or key.endswith("." + name):
                if number > most:
                    refused.append(f"{key} = {_shown(number)} (more than {most})")
                    break
                hits.append((rank, "critic" in key, key.count("."), key, int(number)))
    if not hits:
        return None
    _, _, _, key, number = min(hits)
    return key, number


def settings_from_config(config: Mapping[str, Any], where: str) -> RunSettings:
    """The settings a recorded config holds (unknown keys ignored; nothing guessed)."""
    flat = flatten(config)
    values: dict[str, Any] = {}
    origin: list[tuple[str, str]] = []
    refused: list[str] = []

    def _find(found: Mapping[str, Any], names: tuple[str, ...]) -> tuple[str, int] | None:
        """A factor of a setting (a length, a batch, GPUs per node), bounded as such."""
        return _find_bounded(found, names, _MOST_FACTOR[names], refused)

    for setting, names in _INT_KEYS.items():
        hit = _find_bounded(flat, names, _MOST[setting], refused)
        if hit is not None:
            values[setting] = hit[1]
            origin.append((setting, f"{where}: {hit[0]}"))
    prompt, completion = _find(flat, _PROMPT_LENGTH), _find(flat, _COMPLETION_LENGTH)
    if prompt and completion:
        values["max_length"] = prompt[1] + completion[1]
        origin.append(("max_length", f"{where}: {prompt[0]} + {completion[0]}"))
    else:
        # the Hugging Face W&B callback merges the model's config in, whose top-level
        # max_length is a generation default, not the trainer's: left out there
        length = _find({k: v for k, v in flat.items()
                        if not ("model_type" in flat and k == "max_length")}, _LENGTH)
        if length:
            values["max_length"] = length[1]
            origin.append(("max_length", f"{where}: {length[0]}"))
    if "world_size" not in values:
        gpus, nodes = _find(flat, _GPUS), _find(flat, _NODES)
        if gpus and nodes:
            values["world_size"] = gpus[1] * nodes[1]
            origin.append(("world_size", f"{where}: {gpus[0]} x {nodes[0]}"))
    batch, per_prompt = _find(flat, _TRAIN_BATCH), _find(flat, _SAMPLES_PER_PROMPT)
    if batch and per_prompt:
        values["samples_per_step"] = batch[1] * per_prompt[1]
        origin.append(("samples_per_step", f"{where}: {batch[0]} x {per_prompt[0]}"))
    if "deepspeed" in flat or any(k.startswith("deepspeed.") for k in flat):
        plain = flat.get("deepspeed")
        values["deepspeed"] = bool(plain) if "deepspeed" in flat else True
        origin.append(("deepspeed", f"{where}: deepspeed"))
    for setting in ("world_size", "max_length", "samples_per_step"):  # products of factors
        if values.get(setting, 0) > _MOST[setting]:
            refused.append(f"{setting} = {values.pop(setting)} (more than {_MOST[setting]})")
            origin = [o for o in origin if o[0] != setting]
    return RunSettings(**values, origin=tuple(origin),
                       refused=tuple(f"{where}: {r}" for r in refused))
