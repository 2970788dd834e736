"""verl's `actor_rollout_ref.model.override_config` (HF config values set before the model loads), settled at
finalize: verl's Megatron spelling `{model_config: {...}}` unwrapped, the attention kernel (which verl also reads
from here) kept on rlkit's own key, and the same values handed to the vLLM engine (`hf_overrides`), so the rollout
samples from the model the trainer trains (rlkit.models.config_overrides applies them in the trainer)."""

from __future__ import annotations

from typing import Any

from rlkit.errors import UserError

KEY = "actor_rollout_ref.model.override_config"


def settle_model_overrides(model: Any, rollout: Any) -> None:
    overrides = dict(model.override_config or {})
    if isinstance(overrides.get("model_config"), dict):
        overrides = {**{k: v for k, v in overrides.items() if k != "model_config"}, **overrides["model_config"]}
    attn = overrides.pop("attn_implementation", None)
    if attn is not None and attn != model.attn_implementation:
        raise UserError(f"{KEY}.attn_implementation={attn}: rlkit reads the attention kernel from "
                        f"actor_rollout_ref.model.attn_implementation (now {model.attn_implementation}); set it there")
    model.override_config = overrides
    if not overrides:
        return
    vllm = rollout.engine_kwargs.setdefault("vllm", {})
    given = dict(vllm.get("hf_overrides") or {})
    clash = sorted(k for k in given if k in overrides and given[k] != overrides[k])
    if clash:
        raise UserError(f"{KEY}.{clash[0]}={overrides[clash[0]]} and actor_rollout_ref.rollout.engine_kwargs.vllm."
                        f"hf_overrides.{clash[0]}={given[clash[0]]} differ: the engine would sample from another "
                        "model than the one trained; set it once, in override_config")
    vllm["hf_overrides"] = {**given, **overrides}
