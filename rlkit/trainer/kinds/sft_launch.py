"""`rlkit train sft`: the resource plan, the pre-flight checks and the run (the RL launcher's `run_fit`: Ray, trackers,
Ctrl-C, the run summary)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from rlkit.config.sft_load import world_size
from rlkit.config.sft_schema import SFTConfig


def sft_plan(cfg: SFTConfig) -> Table:
    """What will run where (printed by --dry-run and at start-up)."""
    from rlkit.utils.cpu_precision import plan_row

    t, d = cfg.trainer, cfg.data
    table = Table(title="resource plan (sft)", show_header=False)
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


def sft_preflight(cfg: SFTConfig, allow_download: bool = False, kind: str = "sft") -> list[str]:
    """The data files as the `kind` trainer reads them (format, layout, rows against the batch), the model (resolved
    without a download unless allowed), the checkpoint folder, the trackers (rlkit/trainer/run/preflight_data.py)."""
    from rlkit.trainer.run.preflight_data import supervised_preflight

    return supervised_preflight(cfg, kind, allow_download)


def run_sft(cfg: SFTConfig, opts: Any, console: Console | None = None, trainer_cls: type | None = None,
            plan: Table | None = None, kind: str = "sft") -> Any:
    """Run an SFT job (`trainer_cls`: a trainer on the SFT layout, e.g. DPO's, with its `plan` and the `kind` of
    data files its pre-flight checks); returns the FitSummary (TrainingInterrupted on Ctrl-C / SIGTERM, as
    `rlkit train grpo`)."""
    from rlkit.trainer.kinds.sft_trainer import SFTTrainer
    from rlkit.trainer.run.launch import run_fit
    from rlkit.trainer.run.run_summary import actor_memory
    from rlkit.utils.cpu_precision import resolved_param_dtype

    console = console or Console()
    console.print(plan or sft_plan(cfg))
    console.print("pre-flight ok: " + "; ".join(sft_preflight(cfg, allow_download=True, kind=kind)), soft_wrap=True,
                  markup=False)

    def describe(trainer: Any, summary: Any) -> None:
        summary.memory = actor_memory(trainer.workers.model) or {}
        t = cfg.trainer
        summary.precision = str(resolved_param_dtype(cfg.engine.param_dtype, t.device, max(1, int(t.cpus_per_worker))))

    return run_fit(cfg, opts, console, lambda: (trainer_cls or SFTTrainer)(cfg), describe)
