"""The tables a run prints: the run summary at its end (rewards first -> last, validation, time, precision, memory per
process and per phase, what trains) and how any rlkit table reaches a terminal or a log file."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

LOG_FILE_WIDTH = 400  # wider than any table row, so none wraps


def print_table(console: Console, table: Table) -> None:
    """A table on a terminal fits its width; in a log file it keeps its natural width, so no path or number is
    folded mid-word at rich's default 80 columns."""
    if console.is_terminal:
        console.print(table)
    else:  # a console's width caps print(width=...): a wide one on the same file
        Console(file=console.file, width=LOG_FILE_WIDTH, color_system=None).print(table)


def summary_table(summary: Any) -> Table:
    import math

    table = Table(title="run summary", show_header=False)
    table.add_column("what", no_wrap=True)
    table.add_column("value", overflow="fold")  # paths are shown whole, folded if the terminal is narrow
    table.add_row("steps", str(summary.steps))
    for name, series in (("train reward", summary.train_scores), ("train accuracy", summary.train_acc)):
        values = [s for s in series if not math.isnan(s)]
        if values:
            k = max(1, min(5, len(values) // 3 or 1))
            first, last = sum(values[:k]) / k, sum(values[-k:]) / k
            table.add_row(f"{name} (first {k} -> last {k} steps)", f"{first:.3f} -> {last:.3f}")
    for key in sorted(set(summary.first_val) | set(summary.last_val)):
        if key.startswith(("timing_s", "memory/")):
            continue
        before, after = summary.first_val.get(key), summary.last_val.get(key)
        fmt = lambda v: "-" if v is None else f"{v:.3f}"
        table.add_row(key, f"{fmt(before)} -> {fmt(after)}")
    if summary.step_seconds:
        table.add_row("time per step (median)", f"{sorted(summary.step_seconds)[len(summary.step_seconds) // 2]:.2f}s")
    if hasattr(summary, "wall_s"):
        table.add_row("wall time", f"{summary.wall_s:.0f}s")
    if hasattr(summary, "precision"):
        table.add_row("precision", summary.precision)
    if getattr(summary, "mfu_peak", None):
        table.add_row("perf/mfu peak", summary.mfu_peak)
    for what, value in memory_rows(getattr(summary, "memory", None)):
        table.add_row(what, value)
    for what, value in phase_memory_rows(getattr(summary, "memory_peaks", None)):
        table.add_row(what, value)
    table.add_row("checkpoint", str(summary.checkpoint))
    table.add_row("logs", str(summary.log_dir))
    return table


PHASE_MEMORY_LINES = {"rss_peak_gb": "peak RSS per phase (GB)", "cuda_peak_allocated_gb": "peak CUDA per phase (GB)"}


PROCESS_PEAKS = ("driver", "worker")  # memory/<process>/rss_peak_gb: a whole process's, not one call's


def phase_memory_rows(peaks: dict[str, float] | None) -> list[tuple[str, str]]:
    """Run-summary lines: the driver's and the largest worker's peak RSS, then each worker call's peak memory
    over the run (the largest worker's), per kind."""
    peaks = peaks or {}
    procs = [f"{p} {peaks[f'memory/{p}/rss_peak_gb']:.2f}" for p in PROCESS_PEAKS if f"memory/{p}/rss_peak_gb" in peaks]
    rows = [("peak RSS per process (GB)", ", ".join(procs))] if procs else []
    for name, label in PHASE_MEMORY_LINES.items():
        cells = [f"{key.split('/')[1]} {value:.2f}" for key, value in sorted(peaks.items())
                 if key.endswith("/" + name) and key.count("/") == 2 and key.split("/")[1] not in PROCESS_PEAKS]
        if cells:
            rows.append((label, ", ".join(cells)))
    return rows


def actor_memory(actor: Any) -> dict[str, float] | None:
    """The actor's parameters (all / trained) and its optimizer-state and gradient sizes over all ranks."""
    try:
        reports = actor.memory_report()
    except Exception:  # a summary line must never fail a finished run
        return None
    total = dict(reports[0])
    for key in ("optimizer_state_mb", "grad_mb"):
        total[key] = sum(r[key] for r in reports)
    return total


def moe_params(model_path: str) -> dict[str, float]:
    """Matmul weights a token uses (active experts) and in total, for a mixture-of-experts policy; {} if dense."""
    from transformers import AutoConfig

    from rlkit.utils.flops import matmul_params_per_token, matmul_params_total

    try:
        config = AutoConfig.from_pretrained(model_path)
        active, total = matmul_params_per_token(config), matmul_params_total(config)
    except Exception:  # a summary line must never fail a finished run
        return {}
    return {} if active == total else {"moe_active_params": float(active), "moe_total_params": float(total)}


def memory_rows(memory: dict[str, float] | None) -> list[tuple[str, str]]:
    """Run-summary lines: what trains (full or LoRA), what its optimizer holds, and an MoE's active weights."""
    if not memory:
        return []
    moe = []
    if memory.get("moe_total_params"):
        active, total = memory["moe_active_params"], memory["moe_total_params"]
        moe = [("MoE weights per token (matmuls)", f"{active / 1e6:.2f}M active of {total / 1e6:.2f}M total")]
    if "params" not in memory:
        return moe
    trained, params = memory["trainable_params"], memory["params"]
    lora = f", LoRA rank {int(memory['lora_rank'])}" if memory.get("lora_rank") else ", full fine-tuning"
    return [
        ("trainable parameters", f"{trained / 1e6:.2f}M of {params / 1e6:.2f}M ({100 * trained / params:.2f}%{lora})"),
        ("optimizer state + grads (all ranks)", f"{memory['optimizer_state_mb']:.1f} MB + {memory['grad_mb']:.1f} MB"),
        *moe,
    ]
