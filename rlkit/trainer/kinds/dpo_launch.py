"""The DPO trainer kind (`rlkit train dpo`): the SFT kind's plan rows with the loss and the reference, the
preference files' and the reference model's checks, the DPO trainer. The run around them is every kind's
(rlkit/trainer/run/launch.py `run_kind`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.table import Table

from rlkit.config.checks import world_size
from rlkit.config.dpo_schema import DPOConfig
from rlkit.trainer.kinds import sft_launch

describe = sft_launch.describe  # the same workers, the same summary lines


def plan(cfg: DPOConfig) -> Table:
    """The supervised plan, titled for DPO, with the loss and the reference."""
    table = sft_launch.plan(cfg, kind="dpo")
    d = cfg.dpo
    smoothing = f", label_smoothing {d.label_smoothing}" if d.label_smoothing else ""
    rpo = f", + {d.rpo_alpha} x NLL of chosen" if d.rpo_alpha is not None else ""
    table.add_row("preference loss", f"{d.loss_type} (beta {d.beta}{smoothing}{rpo})")
    reference = "the base model (LoRA adapter off)" if cfg.model.lora_rank else (d.ref.model_path or cfg.model.path)
    table.add_row("reference", f"{reference}, frozen, {precompute_note(cfg) if d.ref.precompute else 'in each worker'}")
    return table


def precompute_note(cfg: DPOConfig) -> str:
    """What dpo.ref.precompute will do, with its memory estimate (the weights it frees, the scores it keeps)."""
    scored = "scores every training and validation pair once before step 1 (8 bytes a pair kept)"
    if cfg.model.lora_rank:
        return f"{scored}; nothing to free: its weights are the policy's"
    mib = weights_mib(cfg.dpo.ref.model_path or cfg.model.path)
    size = f"~{mib / world_size(cfg):.0f} MiB of its ~{mib:.0f} MiB of weights on disk" if mib else "its weights"
    return f"{scored}, then freed from each worker ({size})"


def weights_mib(path: str) -> float | None:
    """The size of a local model folder's weight files (None for a hub id or alias, resolved only at start)."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        return None
    files = [p for pattern in ("*.safetensors", "*.bin") for p in folder.glob(pattern)]
    return sum(p.stat().st_size for p in files) / 2**20 or None


def preflight(cfg: DPOConfig, allow_download: bool = False) -> list[str]:
    """The preference files, the model, the checkpoint folder, and the reference model."""
    from rlkit.models.resolve import resolve_model_path

    notes = sft_launch.preflight(cfg, allow_download, kind="dpo")
    ref = cfg.dpo.ref.model_path
    if ref:
        found = resolve_model_path(ref) if allow_download or Path(ref).expanduser().is_dir() else f"{ref} (resolved "\
            "at start)"
        notes.append(f"reference {found}")
    return notes


def start(cfg: DPOConfig, opts: Any) -> Any:
    from rlkit.trainer.kinds.dpo_trainer import DPOTrainer

    return DPOTrainer(cfg)
