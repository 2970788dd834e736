"""How many tokens (prompt + response) a model can hold, read from its folder's config files.

vLLM refuses an engine whose max_model_len exceeds this with a long validation error; callers
cap their lengths (or name the option to lower) before starting one. The rule mirrors how
engines derive it: the smallest of the length keys in config.json (in `text_config` for
multimodal wrappers), scaled by a RoPE `factor` for scaling types that do not already include
it in max_position_embeddings, and capped by the tokenizer's model_max_length when that is set.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

LENGTH_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "max_sequence_length",
               "max_seq_length", "seq_len")
#: RoPE types whose max_position_embeddings is already the scaled length
PRESCALED_ROPE = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling", "default")
NO_LIMIT = 10**9  # tokenizer configs write 1e30 for "no limit"


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _rope_factor(config: dict[str, Any]) -> float:
    rope = config.get("rope_scaling") or config.get("rope_parameters") or {}
    if not isinstance(rope, dict):
        return 1.0
    kind = rope.get("rope_type") or rope.get("type") or "default"
    factor = rope.get("factor")
    if kind in PRESCALED_ROPE or not isinstance(factor, (int, float)) or factor <= 0:
        return 1.0
    return float(factor)


def text_config(model_dir: str | Path) -> dict[str, Any]:
    """config.json of the model at `model_dir`, a multimodal wrapper's `text_config` keys merged over it
    ({} when the file is missing or unreadable)."""
    config = _read(Path(model_dir) / "config.json")
    text = config.get("text_config")
    return {**config, **text} if isinstance(text, dict) else config


def context_length(model_dir: str | Path) -> int | None:
    """Prompt + response tokens the model at `model_dir` holds; None when its config does not say."""
    folder = Path(model_dir)
    config = text_config(folder)
    lengths = [v for k in LENGTH_KEYS if isinstance(v := config.get(k), int) and not isinstance(v, bool) and v > 0]
    if not lengths:
        return None
    limit = int(min(lengths) * _rope_factor(config))
    tok_max = _read(folder / "tokenizer_config.json").get("model_max_length")
    if isinstance(tok_max, (int, float)) and 0 < tok_max < NO_LIMIT:
        limit = min(limit, int(tok_max))
    return limit


EXPERT_COUNT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")


def declares_experts(model_dir: str | Path) -> bool:
    """A mixture-of-experts model: its (text) config.json declares more than one expert."""
    config = text_config(model_dir)
    return any(isinstance(config.get(k), int) and config[k] > 1 for k in EXPERT_COUNT_KEYS)
