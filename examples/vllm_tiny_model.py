"""A tiny random Qwen2 model and a locally trained tokenizer for the vLLM examples (no hub).

About 100k parameters in float32 (hidden 64, 2 layers, 2 heads, head_dim 32) and a WordLevel
tokenizer of about 300 words trained with ``tokenizers``; both are written in about a second. The
tokenizer lives in a folder of its own: next to a qwen2 ``config.json`` transformers would load
it as ``Qwen2Tokenizer``, which encodes everything to ``[]``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["ENGINE_KWARGS", "PROMPTS", "TinyModel", "build_tiny_model"]

# What the CPU engine needs for this model: the CPU attention backend wants a block size that is a
# multiple of 32; eager mode skips torch.compile (start-up), float32 because the CPU has no fp16.
ENGINE_KWARGS = {"dtype": "float32", "enforce_eager": True, "max_model_len": 128,
                 "block_size": 32, "seed": 0}

_TEXT = ("the a an one two three four five six seven eight nine ten red green blue big small "
          "cat dog bird fish tree house car road river hill sun moon star sky rain snow wind "
          "run walk jump swim fly sing read write eat drink sleep think see hear say ask tell "
          "and or but if then when where why how what who which is are was were be been has have "
          "had do does did can could will would should may might must not no yes very more most "
          "less few many some all any each every other same new old good bad long short high low "
          "left right up down in out on off over under near far here there now later today")
_WORDS = _TEXT.split()
PROMPTS = [f"the {a} {b} can {c}" for a, b, c in
           zip(_WORDS[10:40], _WORDS[20:50], _WORDS[40:70], strict=True)]
_SPECIAL = ["<pad>", "<unk>", "<s>", "</s>"]
_CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                  "{% if add_generation_prompt %}assistant:{% endif %}")


@dataclass(frozen=True)
class TinyModel:
    model: str      # folder with config.json and the weights
    tokenizer: str  # folder with the tokenizer files


def build_tiny_model(folder: str, seed: int = 0) -> TinyModel:
    """Write the model and the tokenizer under ``folder`` and return their two paths."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    model_dir, tok_dir = os.path.join(folder, "model"), os.path.join(folder, "tokenizer")
    raw = Tokenizer(models.WordLevel(unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.Metaspace()
    trainer = trainers.WordLevelTrainer(vocab_size=300, special_tokens=_SPECIAL)
    raw.train_from_iterator([" ".join(_WORDS)] * 4 + PROMPTS, trainer=trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, pad_token="<pad>", unk_token="<unk>",
                                  bos_token="<s>", eos_token="</s>")
    tok.chat_template = _CHAT_TEMPLATE
    tok.save_pretrained(tok_dir)

    torch.manual_seed(seed)
    cfg = Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=2, head_dim=32,
                      vocab_size=320, max_position_embeddings=256, tie_word_embeddings=True,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id, torch_dtype="float32")
    Qwen2ForCausalLM(cfg).to(torch.float32).save_pretrained(model_dir)
    return TinyModel(model_dir, tok_dir)
