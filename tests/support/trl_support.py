"""TRL's GRPOTrainer for real on CPU: a tiny model and tokenizer made locally (no hub), and the
token-weighted truth of each step computed independently from the trainer's own tensors.

The truth does not use rlmon: it wraps ``_compute_loss`` (outside rlmon's hook) to keep each
micro-batch's inputs and ``_get_per_token_logps_and_entropies`` to keep the log-probabilities and
entropies the loss was computed from, and recomputes TRL's formulas (``grpo_trainer.py``:
k3 KL, entropy, the clip masks) in float64 over every token of the step. Rollout truth comes from
what the trainer hands the reward function.
"""

from __future__ import annotations

import atexit
import functools
import math
import random
import shutil
import tempfile
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

WORDS = ("the", "a", "cat", "dog", "sat", "ran", "on", "under", "mat", "box", "red", "blue",
         "one", "two", "three", "yes", "no", "up", "down", "left", "right")


def build_tiny(root: Path) -> tuple[Path, Path]:
    """A random 2-layer Qwen2 (about 100k parameters) and a WordLevel tokenizer in ``root``:
    ``(model_dir, tokenizer_dir)``, in separate folders (transformers 5 loads a tokenizer saved
    beside a qwen2 config as Qwen2Tokenizer, which then encodes to nothing)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator([" ".join(WORDS)] * 4, trainers.WordLevelTrainer(
        special_tokens=["<pad>", "<unk>", "<eos>"]))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>",
                                   eos_token="<eos>")
    fast.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    tok_dir, model_dir = root / "tokenizer", root / "model"
    fast.save_pretrained(tok_dir)
    torch.manual_seed(0)
    # A vocabulary of two dozen words makes EOS likely enough that completion lengths differ
    # between micro-batches, which is what separates a mean of means from the token mean.
    config = Qwen2Config(
        vocab_size=len(fast), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, head_dim=32, tie_word_embeddings=True,
        max_position_embeddings=128, eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id, bos_token_id=None,
    )
    Qwen2ForCausalLM(config).save_pretrained(model_dir)
    return model_dir, tok_dir


@functools.cache
def tiny_model() -> tuple[Path, Path]:
    """Built once per process (a second), removed at exit."""
    root = Path(tempfile.mkdtemp(prefix="rlmon-tiny-qwen2-"))
    atexit.register(shutil.rmtree, root, True)
    return build_tiny(root)


def prompts(n: int = 64, seed: int = 0) -> Any:
    from datasets import Dataset

    rng = random.Random(seed)
    return Dataset.from_dict({"prompt": [
        " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 6))) for _ in range(n)]})


@dataclass
class MicroBatch:
    step: int
    mask: np.ndarray  # (B, T) completion mask
    advantages: np.ndarray  # (B, 1)
    logps: np.ndarray
    old_logps: np.ndarray
    ref_logps: np.ndarray | None
    entropies: np.ndarray


@dataclass
class Generation:
    step: int
    rewards: list[float]
    lengths: list[int]
    truncated: list[bool]


@dataclass
class Truth:
    """What the trainer computed each step, captured from its own tensors."""

    num_generations: int
    eps_low: float
    eps_high: float
    micro: list[MicroBatch] = field(default_factory=list)
    generations: list[Generation] = field(default_factory=list)
    stop_ids: frozenset[int] = frozenset()  # EOS and pad: a completion ending otherwise is clipped
    kl_times_ratio: bool = False  # GRPOConfig.use_bias_correction_kl (TRL 1.16 default: True)

    def reward_fn(self, score: Callable[[str], float]) -> Callable[..., list[float]]:
        """A reward function scoring each completion with ``score``; it keeps what it saw."""

        def reward(completions: list[str], completion_ids: list[list[int]], trainer_state: Any,
                   **_: Any) -> list[float]:
            values = [float(score(c)) for c in completions]
            eos = self.stop_ids
            self.generations.append(Generation(
                trainer_state.global_step + 1, values, [len(ids) for ids in completion_ids],
                [not ids or ids[-1] not in eos for ids in completion_ids]))
            return values

        reward.__name__ = "reward"
        return reward

    def hook(self, trainer: Any) -> None:
        """Wrap the trainer's ``_compute_loss`` (outermost) and its log-prob function."""
        import torch

        self.stop_ids = frozenset([*trainer.eos_token_ids, trainer._tokenizer.pad_token_id])
        self.kl_times_ratio = bool(getattr(trainer.args, "use_bias_correction_kl", False))
        compute, logps_fn = trainer._compute_loss, trainer._get_per_token_logps_and_entropies
        inside: list[dict[str, Any]] = []

        def as_np(t: Any) -> np.ndarray:
            return t.detach().to(torch.float64).cpu().numpy()

        def _get_per_token_logps_and_entropies(*args: Any, **kw: Any) -> Any:
            out = logps_fn(*args, **kw)
            if inside:
                inside[-1]["logps"], inside[-1]["entropies"] = as_np(out[0]), as_np(out[1])
            return out

        def _compute_loss(model: Any, inputs: Any) -> Any:
            if not trainer.model.training:
                return compute(model, inputs)
            inside.append({})
            try:
                loss = compute(model, inputs)
            finally:
                got = inside.pop()
            logps = got["logps"]
            old = inputs.get("old_per_token_logps")
            ref = inputs.get("ref_per_token_logps")
            adv = inputs["advantages"]
            self.micro.append(MicroBatch(
                trainer.state.global_step + 1, as_np(inputs["completion_mask"]),
                as_np(adv if adv.dim() == 2 else adv.unsqueeze(1)), logps,
                logps if old is None else as_np(old), None if ref is None else as_np(ref),
                got["entropies"]))
            return loss

        trainer._compute_loss = _compute_loss
        trainer._get_per_token_logps_and_entropies = _get_per_token_logps_and_entropies

    # -- the truth, per step ---------------------------------------------------------------------

    def loss_truth(self) -> dict[int, dict[str, float]]:
        """Token means over every micro-batch of the step (the exact values)."""
        sums: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        per_mb: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        for mb in self.micro:
            m = mb.mask
            coef = np.exp(mb.logps - mb.old_logps)
            low = (coef < 1 - self.eps_low) & (mb.advantages < 0)
            high = (coef > 1 + self.eps_high) & (mb.advantages > 0)
            values = {"entropy": mb.entropies, "clip_ratio/low_mean": low.astype(float),
                      "clip_ratio/high_mean": high.astype(float),
                      "clip_ratio/region_mean": (low | high).astype(float)}
            if mb.ref_logps is not None:
                d = mb.ref_logps - mb.logps
                values["kl"] = (np.exp(d) - d - 1) * (coef if self.kl_times_ratio else 1.0)
            n = float(m.sum())
            acc = sums[mb.step]
            acc["tokens"] += n
            for key, v in values.items():
                s = float((v * m).sum())
                acc[key] += s
                per_mb[mb.step][key].append(s / max(n, 1.0))
        out: dict[int, dict[str, float]] = {}
        for step, acc in sums.items():
            out[step] = {k: v / acc["tokens"] for k, v in acc.items() if k != "tokens"}
            # What TRL logs: the plain mean of the micro-batch means.
            out[step].update({f"mom:{k}": sum(v) / len(v) for k, v in per_mb[step].items()})
        return out

    def rollout_truth(self) -> dict[int, dict[str, float]]:
        by_step: dict[int, list[Generation]] = defaultdict(list)
        for g in self.generations:
            by_step[g.step].append(g)
        out: dict[int, dict[str, float]] = {}
        for step, gens in by_step.items():
            rewards = np.array([r for g in gens for r in g.rewards], dtype=np.float64)
            lengths = np.array([n for g in gens for n in g.lengths], dtype=np.float64)
            groups = rewards.reshape(-1, self.num_generations)
            zero = np.repeat(groups.std(axis=1, ddof=1) <= 1e-8, self.num_generations)
            out[step] = {
                "rollout/reward": float(rewards.mean()),
                "rollout/reward_std": float(rewards.std()),  # population
                "rollout/reward_min": float(rewards.min()),
                "rollout/reward_max": float(rewards.max()),
                "rollout/frac_reward_zero_std": float(zero.mean()),
                "rollout/response_length": float(lengths.mean()),
                "rollout/response_length_max": float(lengths.max()),
                "rollout/clipped_ratio": float(np.mean([t for g in gens for t in g.truncated])),
                "rollout/samples": float(len(rewards)),
                "rollout/tokens": float(lengths.sum()),
                "sample_std": float(rewards.std(ddof=1)),
            }
        return out


def close(a: float, b: float, rel: float = 2e-5, abs_: float = 1e-6) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return abs(a - b) <= max(rel * max(abs(a), abs(b)), abs_)


def grpo_config(out: Path, **overrides: Any) -> Any:
    """GRPOConfig for CPU: no vLLM, float32, no hub, no checkpoints, a log every step."""
    from trl import GRPOConfig

    kw: dict[str, Any] = dict(
        output_dir=str(out), use_vllm=False, use_cpu=True, bf16=False, report_to="none",
        per_device_train_batch_size=8, num_generations=4, max_completion_length=12,
        logging_steps=1, save_strategy="no", seed=0, disable_tqdm=True,
    )
    kw.update(overrides)
    return GRPOConfig(**kw)


def grpo_trainer(out: Path, reward: Callable[..., list[float]], **config: Any) -> Any:
    from transformers import PreTrainedTokenizerFast
    from trl import GRPOTrainer

    model_dir, tok_dir = tiny_model()
    return GRPOTrainer(
        model=str(model_dir), reward_funcs=reward, args=grpo_config(out, **config),
        processing_class=PreTrainedTokenizerFast.from_pretrained(tok_dir),
        train_dataset=prompts(),
    )
