"""The SFT trainer kind (`rlkit train sft`): its resource plan, its pre-flight checks, the trainer it starts and
the run summary's lines. The run around them is every kind's (rlkit/trainer/run/launch.py `run_kind`)."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from rlkit.config.checks import world_size
from rlkit.config.sft_schema import SFTConfig


def plan(cfg: SFTConfig, kind: str = "sft") -> Table:
    """What will run where (printed by --dry-run and at start-up)."""
    from rlkit.utils.cpu_precision import plan_row

    t, d = cfg.trainer, cfg.data
    table = Table(title=f"resource plan ({kind})", show_header=False)
    table.add_row("workers", f"{t.nnodes} node(s) x {t.n_gpus_per_node} = {world_size(cfg)} (device: {t.device})")
    table.add_row("conversations per step", f"{d.train_batch_size} ({d.train_batch_size // world_size(cfg)} per "
                  "worker)")
    micro = (f"<= {d.max_token_len_per_gpu} tokens" if d.use_dynamic_bsz else f"{d.micro_batch_size_per_gpu} rows")
    table.add_row("micro-batch", f"{micro}, {'packed (varlen)' if d.pad_mode == 'no_padding' else 'right-padded'}")
    lora = f"LoRA rank {cfg.model.lora_rank}" if cfg.model.lora_rank else "full fine-tuning"
    table.add_row("model", f"{cfg.model.path} ({lora})")
    table.add_row("compute dtype", plan_row(cfg.engine.param_dtype, t.device, max(1, int(t.cpus_per_worker))))
    table.add_row("checkpoints", t.default_local_dir)
    return table


def preflight(cfg: SFTConfig, allow_download: bool = False, kind: str = "sft") -> list[str]:
    """The data files as the `kind` trainer reads them (format, layout, rows against the batch), the model (resolved
    without a download unless allowed), the checkpoint folder, the trackers (rlkit/trainer/run/preflight_data.py)."""
    from rlkit.trainer.run.preflight_data import supervised_preflight

    return supervised_preflight(cfg, kind, allow_download)


def start(cfg: SFTConfig, opts: Any) -> Any:
    from rlkit.trainer.kinds.sft_trainer import SFTTrainer

    return SFTTrainer(cfg)


def describe(trainer: Any, summary: Any, cfg: SFTConfig) -> None:
    """The run summary's memory and precision lines (DPO's too: the same workers)."""
    from rlkit.trainer.run.run_summary import actor_memory
    from rlkit.utils.cpu_precision import resolved_param_dtype

    summary.memory = actor_memory(trainer.workers.model) or {}
    t = cfg.trainer
    summary.precision = str(resolved_param_dtype(cfg.engine.param_dtype, t.device, max(1, int(t.cpus_per_worker))))
