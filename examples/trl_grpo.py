"""The TRL snippet of docs/integrations.md as a script: GRPO with rlmon on a tiny model made here, on the CPU.

    python examples/trl_grpo.py [--steps 4] [--run trl-tiny] [--zero-reward]

Needs ``trl`` (``pip install 'rlmon[trl]'``; the extras venv of ``make test-extras`` has it).
Nothing is downloaded: a random 2-layer Qwen2 and a word-level tokenizer are built in a temporary
folder. The two rlmon lines are the ones marked below. By default the callback's Reporter sends
to rlmon on Ray (it starts a local Ray and the rlmon service if none is running);
``RLMON_SINK_JSONL=run.jsonl`` writes the contract lines to a file instead, for
``rlmon replay run.jsonl``. ``--zero-reward`` gives every completion reward 0: every prompt group
ties, GRPO has no learning signal, and with ``--steps 6`` rlmon's ``NoLearningSignal`` fires on
this console at step 5, the third step that generated (``num_iterations=2``: every other step).
"""

from __future__ import annotations

import argparse
import random
import tempfile
from pathlib import Path

WORDS = ("the", "a", "cat", "dog", "sat", "ran", "on", "under", "mat", "box", "red", "blue",
         "one", "two", "three", "yes", "no")


def build_tiny_model(root: Path) -> tuple[str, str]:
    """A random Qwen2 (hidden 64, 2 layers) and a word-level tokenizer, in separate folders."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.Metaspace(), decoders.Metaspace()
    tok.train_from_iterator([" ".join(WORDS)], trainers.WordLevelTrainer(
        special_tokens=["<pad>", "<unk>", "<eos>"]))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>",
                                   eos_token="<eos>")
    fast.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    fast.save_pretrained(root / "tokenizer")
    torch.manual_seed(0)
    Qwen2ForCausalLM(Qwen2Config(
        vocab_size=len(fast), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, head_dim=32, tie_word_embeddings=True,
        max_position_embeddings=128, eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id, bos_token_id=None,
    )).save_pretrained(root / "model")
    return str(root / "model"), str(root / "tokenizer")


def reward_cats(completions: list[str], **_: object) -> list[float]:
    return [c.count("cat") + 0.1 * len(c.split()) for c in completions]


def reward_zero(completions: list[str], **_: object) -> list[float]:
    return [0.0] * len(completions)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--run", default="trl-tiny")
    parser.add_argument("--zero-reward", action="store_true")
    args = parser.parse_args()

    from datasets import Dataset
    from transformers import PreTrainedTokenizerFast
    from trl import GRPOConfig, GRPOTrainer

    from rlmon.actors.integrations.trl import RlmonCallback  # rlmon, line 1

    rng = random.Random(0)
    dataset = Dataset.from_dict({"prompt": [
        " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 6))) for _ in range(64)]})
    with tempfile.TemporaryDirectory(prefix="rlmon-trl-example-") as tmp:
        model, tokenizer = build_tiny_model(Path(tmp))
        config = GRPOConfig(
            output_dir=str(Path(tmp) / "out"), use_vllm=False, use_cpu=True, bf16=False,
            report_to="none", per_device_train_batch_size=8, num_generations=4,
            max_completion_length=12, gradient_accumulation_steps=2, num_iterations=2,
            beta=0.04, learning_rate=5e-3, max_steps=args.steps, logging_steps=1,
            save_strategy="no", disable_tqdm=True, seed=0,
        )
        reward = reward_zero if args.zero_reward else reward_cats
        trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config,
                              train_dataset=dataset,
                              processing_class=PreTrainedTokenizerFast.from_pretrained(tokenizer))
        callback = RlmonCallback.attach(trainer, run=args.run)  # rlmon, line 2
        trainer.train()
    if not callback.reporter.flush(30.0):  # every step acknowledged by rlmon's aggregator
        print(f"rlmon: steps of run {args.run!r} not delivered: {callback.reporter.last_error}")
        return 1
    canonical = sorted({n for n in callback.published.values() if not n.startswith("trl/")})
    print(f"rlmon: {trainer.state.global_step} steps of run {args.run!r} delivered: "
          f"{', '.join(canonical)} and {len(callback.published) - len(canonical)} trl/ keys")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
