"""The config of `rlkit train dpo`: composed over conf/rlkit_dpo.yaml and the DPO schema (the SFT schema + `dpo:`),
finalized as an SFT config, then the DPO checks: one line per bad value, and the SFT keys that mean nothing for
preference pairs refused when set. `dpo.loss_type` names a registry entry (rlkit.algo.preference_loss), checked by
the trainer layer, which owns the registry.

    cfg = load_dpo_config(["data.train_files=pairs/train.parquet", "model.path=./sft_model"])
"""

from __future__ import annotations

from dataclasses import fields

from rlkit.config.dpo_schema import DPOConfig
from rlkit.config.load import ConfigSpace, compose_config
from rlkit.config.sft_load import finalize_sft
from rlkit.config.sft_schema import SFTDataConfig
from rlkit.config.verl_sft_keys import VERL_SFT_KEYS
from rlkit.errors import UserError

#: `rlkit train dpo`: the DPO schema, conf/rlkit_dpo.yaml; verl's SFT keys read as for SFT; no presets
DPO_SPACE = ConfigSpace(DPOConfig, "rlkit_dpo", "dpo_schema", VERL_SFT_KEYS, (), presets=False)

#: data keys of conversations and prompt/response columns: a preference file has prompt/chosen/rejected
CONVERSATION_KEYS = ("messages_key", "tools_key", "enable_thinking_key", "enable_thinking_default", "prompt_key",
                     "response_key", "prompt_dict_keys", "response_dict_keys")


def load_dpo_config(overrides: list[str] | None = None, config_file: str | None = None,
                    config_path: str | None = None, config_name: str | None = None,
                    notices: list[str] | None = None) -> DPOConfig:
    """The validated, finalized DPO config (arguments as `load_sft_config`'s)."""
    cfg = compose_config(None, overrides, config_file, config_path=config_path, config_name=config_name,
                         notices=notices, space=DPO_SPACE)
    finalize_dpo(cfg)
    return cfg


def finalize_dpo(cfg: DPOConfig) -> None:
    """The SFT checks, then the preference loss's values and the keys DPO does not read."""
    finalize_sft(cfg)
    d = cfg.dpo
    defaults = {fl.name: fl.default for fl in fields(SFTDataConfig)}
    for key in CONVERSATION_KEYS:
        if getattr(cfg.data, key) != defaults[key]:
            raise UserError(f"data.{key}: a conversation key of SFT; a DPO file has the columns prompt, chosen, "
                            f"rejected (docs/dpo.md), remove data.{key}")
    if d.beta <= 0:
        raise UserError(f"dpo.beta={d.beta} must be > 0 (DPO's default is 0.1)")
    if not 0 <= d.label_smoothing < 0.5:
        raise UserError(f"dpo.label_smoothing={d.label_smoothing} must be in [0, 0.5) (a flip rate below a coin's)")
    if d.rpo_alpha is not None and d.rpo_alpha < 0:
        raise UserError(f"dpo.rpo_alpha={d.rpo_alpha} must be >= 0 or null")
    if not 0 < d.max_prompt_length < cfg.data.max_length:
        raise UserError(f"dpo.max_prompt_length={d.max_prompt_length} must be > 0 and below data.max_length="
                        f"{cfg.data.max_length} (room for the completion)")
    if cfg.model.lora_rank > 0 and d.ref.model_path:
        raise UserError("dpo.ref.model_path with LoRA: the reference is the base model with the adapter off; remove "
                        "dpo.ref.model_path or set model.lora_rank=0")
