"""`rlkit train dpo`: the SFT launcher's plan, pre-flight and run (rlkit/trainer/kinds/sft_launch.py) with DPO's
rows and the reference model's check."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from rlkit.config.dpo_schema import DPOConfig


def dpo_plan(cfg: DPOConfig) -> Table:
    """The SFT plan, titled for DPO, with the loss and the reference."""
    from rlkit.trainer.kinds.sft_launch import sft_plan

    table = sft_plan(cfg)
    table.title = "resource plan (dpo)"
    d = cfg.dpo
    smoothing = f", label_smoothing {d.label_smoothing}" if d.label_smoothing else ""
    rpo = f", + {d.rpo_alpha} x NLL of chosen" if d.rpo_alpha is not None else ""
    table.add_row("preference loss", f"{d.loss_type} (beta {d.beta}{smoothing}{rpo})")
    reference = "the base model (LoRA adapter off)" if cfg.model.lora_rank else (d.ref.model_path or cfg.model.path)
    table.add_row("reference", f"{reference}, frozen, in each worker")
    return table


def dpo_preflight(cfg: DPOConfig, allow_download: bool = False) -> list[str]:
    """The SFT checks (preference files, model, checkpoint folder) and the reference model's."""
    from rlkit.models.resolve import resolve_model_path
    from rlkit.trainer.kinds.sft_launch import sft_preflight

    notes = sft_preflight(cfg, allow_download, kind="dpo")
    ref = cfg.dpo.ref.model_path
    if ref:
        found = resolve_model_path(ref) if allow_download or Path(ref).expanduser().is_dir() else f"{ref} (resolved "\
            "at start)"
        notes.append(f"reference {found}")
    return notes


def run_dpo(cfg: DPOConfig, opts: Any, console: Console | None = None) -> Any:
    """Run a DPO job as `rlkit train sft` runs (Ray, trackers, Ctrl-C, the run summary); returns the FitSummary."""
    from rlkit.trainer.kinds.dpo_trainer import DPOTrainer
    from rlkit.trainer.kinds.sft_launch import run_sft

    return run_sft(cfg, opts, console, trainer_cls=DPOTrainer, plan=dpo_plan(cfg), kind="dpo")
