"""Tiny random mixture-of-experts models of two families (Qwen3-MoE, Mixtral) for the layout/sync tests.

head_dim 64 (vLLM's CPU attention has no head_dim 16 kernel), 8 experts, top-2; the lm_head is sharpened so
greedy argmax margins stay far above float32 kernel noise.
"""

from __future__ import annotations

from pathlib import Path

import torch

from rlkit.testing import build_tiny_tokenizer


def _qwen3_moe(vocab: int, pad: int, eos: int, hidden: int = 128, heads: int = 2, experts: int = 8, tie: bool = False):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    cfg = Qwen3MoeConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=256, moe_intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=heads, num_key_value_heads=1, head_dim=64, num_experts=experts, num_experts_per_tok=2,
        max_position_embeddings=512, tie_word_embeddings=tie, pad_token_id=pad, eos_token_id=eos,
    )
    return Qwen3MoeForCausalLM(cfg)


def _mixtral(vocab: int, pad: int, eos: int, hidden: int = 128, heads: int = 2, experts: int = 8, tie: bool = False):
    from transformers import MixtralConfig, MixtralForCausalLM

    cfg = MixtralConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=64, num_hidden_layers=2, num_attention_heads=heads,
        num_key_value_heads=1, head_dim=64, num_local_experts=experts, num_experts_per_tok=2,
        max_position_embeddings=512, tie_word_embeddings=tie, pad_token_id=pad, eos_token_id=eos,
    )
    return MixtralForCausalLM(cfg)


FAMILIES = {"qwen3_moe": _qwen3_moe, "mixtral": _mixtral}


def build_tiny_moe(family: str, seed: int = 0, sharpen: float = 8.0, **size):
    """`size`: hidden, heads, experts, tie (tied embeddings give the copy bias the toy task learns from)."""
    tokenizer = build_tiny_tokenizer()
    torch.manual_seed(seed)
    model = FAMILIES[family](len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id, **size)
    if sharpen != 1.0:
        with torch.no_grad():
            model.lm_head.weight.mul_(sharpen)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.eval(), tokenizer


def save_tiny_moe(path: str | Path, family: str = "qwen3_moe", seed: int = 0, sharpen: float = 8.0, **size) -> Path:
    model, tokenizer = build_tiny_moe(family, seed, sharpen, **size)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return Path(path)
