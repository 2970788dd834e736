"""The CPU KV cache sized from the batch (rlkit/rollout/kv_cache_size.py): the arithmetic on real model
shapes, the derived `batch_rows`, and that vLLM's own block count agrees with our bytes per token."""

from __future__ import annotations

import json

import pytest

from rlkit.rollout import kv_cache_size
from rlkit.rollout.kv_cache_size import CPU_BLOCK_TOKENS, auto_kv_cache_mb, kv_bytes_per_token

SMOLLM2_135M = {"num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "hidden_size": 576}


def folder(tmp_path, cfg: dict):
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return tmp_path


def test_bytes_per_token_follow_the_attention_shape(tmp_path):
    path = folder(tmp_path, SMOLLM2_135M)
    assert kv_bytes_per_token(path, "float32") == 2 * 30 * 3 * 64 * 4  # K and V, GQA heads, head_dim 576/9
    assert kv_bytes_per_token(path, "bfloat16") == 2 * 30 * 3 * 64 * 2
    nested = folder(tmp_path, {"text_config": {**SMOLLM2_135M, "head_dim": 128}})  # multimodal wrapper, explicit dim
    assert kv_bytes_per_token(nested, "float32") == 2 * 30 * 3 * 128 * 4


def test_batch_sized_cache_for_the_benchmark_workload(tmp_path):
    """16 samples of 256 + 128 tokens: 3 blocks each plus vLLM's null block, 283 MiB instead of 512."""
    mb = auto_kv_cache_mb(folder(tmp_path, SMOLLM2_135M), "float32", rows=16, model_len=384)
    assert mb == -(-(16 * 3 + 1) * CPU_BLOCK_TOKENS * 46080 // 2**20)


def test_cap_and_fallback(tmp_path, monkeypatch):
    path = folder(tmp_path, SMOLLM2_135M)
    monkeypatch.setattr(kv_cache_size, "host_memory_bytes", lambda: 8 * 2**30)
    assert auto_kv_cache_mb(path, "float32", rows=64, model_len=8192) == 1024  # an eighth of 8 GiB
    monkeypatch.setattr(kv_cache_size, "host_memory_bytes", lambda: 2**20)  # never below one sequence
    one_row = (32768 // CPU_BLOCK_TOKENS + 1) * CPU_BLOCK_TOKENS * 46080
    assert auto_kv_cache_mb(path, "float32", rows=64, model_len=32768) == -(-one_row // 2**20)
    latent = folder(tmp_path, {**SMOLLM2_135M, "kv_lora_rank": 512})
    assert auto_kv_cache_mb(latent, "float32", rows=4, model_len=128) == kv_cache_size.FALLBACK_MB


def test_batch_rows_come_from_the_batch():
    from rlkit.trainer.run.run_config import load_config

    cfg = load_config("grpo", ["data.train_batch_size=4", "actor_rollout_ref.rollout.n=4",
                              "actor_rollout_ref.actor.ppo_mini_batch_size=4"])
    assert cfg.actor_rollout_ref.rollout.batch_rows == 16 and cfg.actor_rollout_ref.rollout.kv_cache_memory_mb is None
    big = load_config("grpo", ["data.train_batch_size=256", "actor_rollout_ref.rollout.n=8"])
    assert big.actor_rollout_ref.rollout.batch_rows == big.actor_rollout_ref.rollout.max_num_seqs


def test_vllm_block_count_matches_our_bytes(model_path, vllm_engine):
    """The session engine is auto-sized: vLLM's block count from that budget must be what our per-token
    bytes predict (a formula that under-counted would starve the batch, one that over-counted wastes RAM)."""
    cfg = vllm_engine.llm.llm_engine.vllm_config.cache_config
    per_token = kv_bytes_per_token(model_path, vllm_engine.dtype)
    budget = auto_kv_cache_mb(model_path, vllm_engine.dtype, vllm_engine.config.batch_rows,
                              vllm_engine.config.model_len) << 20
    assert vllm_engine.config.kv_cache_memory_mb is None and cfg.block_size == CPU_BLOCK_TOKENS
    assert cfg.num_gpu_blocks == budget // (CPU_BLOCK_TOKENS * per_token)


@pytest.mark.parametrize("bad", [0, -1])
def test_bad_size_names_the_key(bad):
    from rlkit.errors import UserError
    from rlkit.rollout import RolloutConfig

    with pytest.raises(UserError, match="kv_cache_memory_mb"):
        RolloutConfig(kv_cache_memory_mb=bad)
