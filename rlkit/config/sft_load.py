"""The config of `rlkit train sft`: composed as `rlkit train`'s (rlkit.config.load, over conf/rlkit_sft.yaml and the
SFT schema), then finalized here: verl's spellings settled, sizes checked, one line per bad value.

    cfg = load_sft_config(["data.train_files=train.parquet", "model.path=./tiny"])
"""

from __future__ import annotations

from typing import Any

from rlkit.config.load import ConfigSpace, compose_config
from rlkit.config.optim import settle_optim
from rlkit.config.sft_schema import PAD_MODES, SFTConfig
from rlkit.config.verl_sft_keys import VERL_SFT_KEYS
from rlkit.errors import UserError

#: `rlkit train sft`: the SFT schema, conf/rlkit_sft.yaml (verl's names sft_trainer / sft_trainer_engine), no presets
SFT_SPACE = ConfigSpace(SFTConfig, "rlkit_sft", "sft_schema", VERL_SFT_KEYS, ("sft_trainer", "sft_trainer_engine"),
                        presets=False)
TRUNCATIONS = ("error", "left", "right")
THINKING = {"none": None, "null": None, "true": True, "false": False}


def load_sft_config(overrides: list[str] | None = None, config_file: str | None = None,
                    config_path: str | None = None, config_name: str | None = None,
                    notices: list[str] | None = None, space: ConfigSpace = SFT_SPACE) -> Any:
    """The validated, finalized SFT config (`space`: a schema that extends the SFT one, e.g. DPO's)."""
    cfg = compose_config(None, overrides, config_file, config_path=config_path, config_name=config_name,
                         notices=notices, space=space)
    finalize_sft(cfg)
    return cfg


def finalize_sft(cfg: SFTConfig) -> None:
    """verl's -1 / one-name spellings settled, then the checks `--dry-run` would otherwise only hit in the workers."""
    data, t = cfg.data, cfg.trainer
    for key in ("train_max_samples", "val_max_samples"):
        if getattr(data, key) is not None and getattr(data, key) < 0:
            setattr(data, key, None)
    if isinstance(t.logger, str):
        t.logger = [t.logger]
    settle_optim(cfg.optim, "optim")  # min_lr onto min_lr_ratio, the optimizer class and its arguments checked
    if not data.train_files:
        raise UserError("data.train_files is empty: pass data.train_files=PATH.parquet (make one with "
                        "`rlkit data gsm8k --format sft` or `rlkit data messages FILE.jsonl`)")
    if data.pad_mode not in PAD_MODES:
        raise UserError(f"data.pad_mode={data.pad_mode} is not supported; use one of {list(PAD_MODES)}")
    if data.truncation not in TRUNCATIONS:
        raise UserError(f"data.truncation={data.truncation} is not supported for SFT; use one of {list(TRUNCATIONS)}")
    if str(data.enable_thinking_default).lower() not in THINKING:
        raise UserError(f"data.enable_thinking_default={data.enable_thinking_default}: use true, false or none")
    for key in ("train_batch_size", "micro_batch_size_per_gpu", "max_token_len_per_gpu", "max_length"):
        if getattr(data, key) < 1:
            raise UserError(f"data.{key}={getattr(data, key)} must be >= 1")
    workers = t.nnodes * t.n_gpus_per_node
    if workers < 1:
        raise UserError(f"trainer.nnodes x trainer.n_gpus_per_node = {workers}: need at least one worker")
    if data.train_batch_size % workers:
        raise UserError(f"data.train_batch_size={data.train_batch_size} must be divisible by the {workers} workers "
                        "(trainer.nnodes x trainer.n_gpus_per_node)")
    if t.total_epochs < 1 and not t.total_training_steps:
        raise UserError(f"trainer.total_epochs={t.total_epochs}: set >= 1 or trainer.total_training_steps")


def thinking_default(value: Any) -> bool | None:
    """data.enable_thinking_default as the template keyword's value (None: not passed)."""
    return THINKING[str(value).lower()]

