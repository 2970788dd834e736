"""The console tracker: a progress bar and a compact per-step table of the metrics worth watching.

Its own module because its choices (which keys, how they group, how often a log file gets a line) are about
reading a run live, not about storing it.
"""

from __future__ import annotations

import fnmatch
import math
import os
import time
from collections.abc import Sequence
from typing import Any

from rlkit.phases import PHASES
from rlkit.utils.tracker_base import TRACKERS, Generation, RunInfo, generation_rows

# What the per-step table shows (fnmatch patterns, in display order); everything goes to the other backends.
CONSOLE_KEYS = [
    "critic/score/mean", "critic/reward_baseline/mean", "critic/rewards/mean", "critic/advantages/mean",
    "critic/vf_loss",
    "actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm", "actor/pg_clipfrac", "actor/lr",
    "train/loss", "train/grad_norm", "train/lr",  # rlkit train sft
    "rewards/accuracies", "rewards/margins",  # rlkit train dpo (TRL's names)
    "response_length/mean", "response_length/clip_ratio", "prompt_length/mean",
    "timing_s/step", *(f"timing_s/{name}" for name, phase in PHASES.items() if phase.console),
    "perf/throughput", "perf/tokens_per_s", "perf/mfu", "memory/*/rss_peak_gb", "memory/*/cuda_peak_allocated_gb",
    "val/*",
]
CONSOLE_FALLBACK_ROWS = 16  # when none of CONSOLE_KEYS is present, the first keys alphabetically
# Console row labels by key prefix (default: the key's first part). The field's names put the reward and
# advantage statistics under `critic/` even without a critic (GRPO); the table shows them as "reward", so
# a "critic" row means a real value model. Metric keys in the files are unchanged.
CONSOLE_GROUPS = {"critic/score/": "reward", "critic/rewards/": "reward", "critic/advantages/": "reward",
                  "critic/returns/": "reward", "critic/reward_baseline/": "reward"}


# validation generations the console prints (the other backends get all trainer.log_val_generations of them)
CONSOLE_GENERATIONS, CONSOLE_GENERATION_CHARS = 3, 300

# log files: at most one progress line per phase this often (RLKIT_PROGRESS_EVERY_S; 0 = every update)
PROGRESS_EVERY_S = float(os.environ.get("RLKIT_PROGRESS_EVERY_S", "10"))


# `memory/<method>/<name>` (rlkit.utils.memory_peak): one row per kind of peak, a cell per worker call
CONSOLE_MEMORY_ROWS = {"rss_peak_gb": "peak RSS GB", "rss_end_gb": "RSS GB", "cuda_peak_allocated_gb": "peak CUDA GB"}


def console_group(key: str) -> tuple[str, str]:
    """(row label, cell name) of a metric key in the console table."""
    if key.startswith("memory/") and key.count("/") == 2:
        _, method, name = key.split("/")
        if name in CONSOLE_MEMORY_ROWS:
            return CONSOLE_MEMORY_ROWS[name], method
    for prefix, label in CONSOLE_GROUPS.items():
        if key.startswith(prefix):
            return label, key.split("/", 1)[1]
    group, _, name = key.partition("/")
    return group, name or group


def format_value(value: float) -> str:
    if value != 0 and (abs(value) >= 1e5 or abs(value) < 1e-3) and math.isfinite(value):
        return f"{value:.2e}"
    return f"{value:.4g}"


def select_keys(metrics: dict[str, float], patterns: list[str]) -> list[str]:
    """Keys matching `patterns`, in pattern order; the first few keys when none match."""
    chosen = list(dict.fromkeys(k for p in patterns for k in sorted(metrics) if fnmatch.fnmatchcase(k, p)))
    return chosen or sorted(metrics)[:CONSOLE_FALLBACK_ROWS]


@TRACKERS.register("console")
class ConsoleTracker:
    """A progress bar over total steps (with ETA) and a compact metrics table per step, grouped by prefix.

    On a terminal the bar is live; in a log file (Ray, CI) each step prints one table whose title is the
    plain progress line (step, elapsed, eta). Long phases inside a step (validation over many prompts)
    report through `progress(phase, done, total)`: a second bar on a terminal, a line per update otherwise.
    """

    def __init__(self, run: RunInfo, console: Any = None, keys: list[str] | None = None) -> None:
        from rich.console import Console

        self.console = console or Console()
        self.keys = keys or CONSOLE_KEYS
        self.total = run.total_steps
        self._start = time.monotonic()
        self._first: tuple[int, float] | None = None
        self._progress = None
        self._phases: dict[str, list] = {}  # phase -> [bar task or None, start, last line printed or None]
        if self.console.is_terminal and self.total:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                      TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                                      console=self.console)
            self._task = self._progress.add_task(f"{run.project}/{run.experiment}", total=self.total)
            self._progress.start()

    def render(self, metrics: dict[str, float], step: int, title: str | None = None) -> Any:
        from rich.table import Table

        title = title or self.step_name(step)
        table = Table(title=title, title_justify="left", show_header=False, box=None, padding=(0, 1))
        table.add_column(style="bold cyan", no_wrap=True)
        table.add_column()
        groups: dict[str, list[str]] = {}
        for key in select_keys(metrics, self.keys):
            group, name = console_group(key)
            groups.setdefault(group, []).append(f"{name} [bold]{format_value(metrics[key])}[/bold]")
        for group, cells in groups.items():
            table.add_row(group, "  ".join(cells))
        return table

    def step_name(self, step: int) -> str:
        """`step 3/10`; step 0 is the validation before the first step, and says so."""
        if step == 0:
            return "validation before training"
        return f"step {step}" + (f"/{self.total}" if self.total else "")

    def eta_line(self, step: int) -> str:
        now = time.monotonic()
        if self._first is None:
            self._first = (step, now)
        line = self.step_name(step) + f"  elapsed {now - self._start:.0f}s"
        done = step - self._first[0]
        if self.total and done > 0:
            line += f"  eta {(now - self._first[1]) / done * max(0, self.total - step):.0f}s"
        return line

    def log(self, metrics: dict[str, float], step: int) -> None:
        if self._progress is not None:
            self._progress.console.print(self.render(metrics, step))
            self._progress.update(self._task, completed=step)
        else:  # one line per step in a log file: the progress line is the table's title
            self.console.print(self.render(metrics, step, title=self.eta_line(step)))

    def log_generations(self, samples: Sequence[Generation], step: int) -> None:
        """The first CONSOLE_GENERATIONS samples, each cut to CONSOLE_GENERATION_CHARS characters."""
        for _, inp, out, score in generation_rows(samples[:CONSOLE_GENERATIONS], step):
            self.console.print(f"[bold]val generation[/bold] step {step} score {score}", highlight=False)
            for label, text in (("input", inp), ("output", out)):
                text = str(text)
                cut = text if len(text) <= CONSOLE_GENERATION_CHARS else text[:CONSOLE_GENERATION_CHARS] + "..."
                self.console.print(f"  {label}: {cut}", markup=False, highlight=False)

    def progress(self, phase: str, done: int, total: int) -> None:
        """`done` of `total` items of a long phase (e.g. validation prompts); done == total ends it.

        In a log file a line is printed at most every PROGRESS_EVERY_S, so a short phase prints nothing."""
        now = time.monotonic()
        if phase not in self._phases:
            task = self._progress.add_task(phase, total=total) if self._progress is not None else None
            self._phases[phase] = [task, now, None]
        state = self._phases[phase]
        task, start, last = state
        if task is not None:
            self._progress.update(task, completed=done, total=total)  # type: ignore[union-attr]
        elif 0 < done and (now - (last or start) >= PROGRESS_EVERY_S or (done >= total and last is not None)):
            eta = f"  eta {(now - start) / done * (total - done):.0f}s" if done < total else ""
            self.console.print(f"{phase} {done}/{total}  elapsed {now - start:.0f}s{eta}", style="dim")
            state[2] = now
        if done >= total:
            if task is not None:
                self._progress.remove_task(task)  # type: ignore[union-attr]
            del self._phases[phase]

    def finish(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
