"""verl's `model.override_config`: values set on the HF model's config before the weights load (attention dropout,
rope scaling, max_position_embeddings...), in the trainer's model and, through vLLM's `hf_overrides`, the engine's."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlkit.errors import UserError

KEY = "actor_rollout_ref.model.override_config"


def apply_config_overrides(config: Any, overrides: Mapping[str, Any] | None, key: str = KEY) -> Any:
    """Set each override on `config` (a vision-language model's: on its language model's config when only that has
    it); a name the config does not have is one line, since the model would not read it. Returns `config`."""
    for name, value in (overrides or {}).items():
        target = config
        if not hasattr(config, name):
            text = config.get_text_config() if hasattr(config, "get_text_config") else config
            if not hasattr(text, name):
                raise UserError(f"{key}.{name}: the model's config ({type(config).__name__}) has no setting '{name}', "
                                "so the model would not read it; remove it or check its spelling")
            target = text
        setattr(target, name, dict(value) if isinstance(value, Mapping) else value)
    return config
