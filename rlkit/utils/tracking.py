"""Experiment trackers behind one facade: `Tracking(["console", "jsonl"], ...).log(metrics, step)`.

Backends are looked up by name in `TRACKERS` (the names written in `trainer.logger`), so a
new one is a class plus a decorator. Metrics arrive as floats, tensors or lists (per-sample
values from `Batch.meta["metrics"]`); the facade reduces everything to one float per key
before any backend sees it, so all backends log identical numbers.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any, Protocol

from rlkit.errors import UserError
from rlkit.registry import Registry

log = logging.getLogger("rlkit.tracking")


class Tracker(Protocol):
    def log(self, metrics: dict[str, float], step: int) -> None: ...

    def finish(self) -> None: ...


@dataclasses.dataclass
class RunInfo:
    """What every backend is constructed with."""

    project: str
    experiment: str
    log_dir: Path
    total_steps: int | None
    config: dict[str, Any]


TRACKERS: Registry[type] = Registry("tracker")


def to_float(value: Any) -> float | None:
    """Mean of a list/array/tensor, float of a scalar; None for empty or non-numeric values."""
    if value is None or isinstance(value, (str, bytes)):
        return None
    if isinstance(value, (bool, int, float)):
        return float(value)
    if hasattr(value, "detach"):  # torch tensor
        value = value.detach().float().cpu()
        return float(value.mean()) if value.numel() else None
    if isinstance(value, (list, tuple)):
        items = [v for v in (to_float(v) for v in value) if v is not None]
        return sum(items) / len(items) if items else None
    if hasattr(value, "dtype") and hasattr(value, "size"):  # numpy array or scalar
        try:
            return float(value.mean()) if value.size else None
        except (TypeError, ValueError):
            return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def to_floats(metrics: dict[str, Any]) -> dict[str, float]:
    """What a tracker logs: one float per key (`to_float`: lists by their mean); non-numeric and empty values
    are dropped."""
    return {k: v for k, v in ((k, to_float(v)) for k, v in metrics.items()) if v is not None}


def plain_config(config: Any) -> dict[str, Any]:
    """A JSON-able dict from a dict, dataclass or OmegaConf config (for wandb/tensorboard/file)."""
    if config is None:
        return {}
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        config = dataclasses.asdict(config)
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(config, DictConfig):
            config = OmegaConf.to_container(config, resolve=True)
    except ImportError:  # pragma: no cover
        pass
    return json.loads(json.dumps(dict(config), default=str))


# ---------------------------------------------------------------- file


@TRACKERS.register("jsonl", "file")
class JsonlTracker:
    """One JSON object per step in `<log_dir>/metrics.jsonl`, flushed at once (a crash loses nothing).

    Non-finite values are written as null so every line is strict JSON.
    """

    def __init__(self, run: RunInfo) -> None:
        run.log_dir.mkdir(parents=True, exist_ok=True)
        self.path = run.log_dir / "metrics.jsonl"
        self._file = open(self.path, "a", encoding="utf-8")

    def log(self, metrics: dict[str, float], step: int) -> None:
        row = {"step": step, "time": round(time.time(), 3)}
        row.update({k: (v if math.isfinite(v) else None) for k, v in metrics.items()})
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()

    def rewind(self, step: int) -> int:
        """Drop the rows after `step` (and a torn last line), so the steps a resumed run replays appear
        once; returns how many rows were dropped. The file is replaced atomically."""
        self._file.close()
        kept, dropped = [], 0
        with open(self.path, encoding="utf-8") as f:
            for line in f:
                try:
                    row_step = json.loads(line).get("step")
                except (ValueError, AttributeError):
                    row_step = None
                if isinstance(row_step, (int, float)) and row_step <= step:
                    kept.append(line if line.endswith("\n") else line + "\n")
                elif line.strip():
                    dropped += 1
        if dropped:
            tmp = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}")
            tmp.write_text("".join(kept), encoding="utf-8")
            os.replace(tmp, self.path)
        self._file = open(self.path, "a", encoding="utf-8")
        return dropped

    def finish(self) -> None:
        if not self._file.closed:
            self._file.close()


# ---------------------------------------------------------------- tensorboard


@TRACKERS.register("tensorboard")
class TensorboardTracker:
    """Scalars under `<log_dir>/tensorboard`; the config goes in as a text summary."""

    def __init__(self, run: RunInfo) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise UserError(
                "tracker 'tensorboard' needs the tensorboard package: pip install 'rlkit[tracking]' "
                "(or pip install tensorboard), or drop it from trainer.logger"
            ) from None
        self.dir = run.log_dir / "tensorboard"
        self._writer_cls = SummaryWriter
        self._writer = SummaryWriter(log_dir=str(self.dir))
        if run.config:
            self._writer.add_text("config", "```\n" + json.dumps(run.config, indent=2) + "\n```", 0)

    def log(self, metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            self._writer.add_scalar(key, value, step)
        self._writer.flush()

    def rewind(self, step: int) -> int:
        """Reopen with `purge_step`, so TensorBoard hides the old events after `step` (replayed on resume)."""
        self._writer.close()
        self._writer = self._writer_cls(log_dir=str(self.dir), purge_step=step + 1)
        return 0

    def finish(self) -> None:
        self._writer.close()


# ---------------------------------------------------------------- wandb


@TRACKERS.register("wandb")
class WandbTracker:
    """Weights & Biases, only when installed and asked for; offline mode when wandb.ai is unreachable
    (sync later with `wandb sync <log_dir>/wandb/offline-run-*`)."""

    def __init__(self, run: RunInfo) -> None:
        try:
            import wandb
        except ImportError:
            raise UserError("tracker 'wandb' needs the wandb package: pip install 'rlkit[wandb]', "
                            "or drop it from trainer.logger") from None
        from rlkit.utils.network import network_disabled, url_reachable

        mode = os.environ.get("WANDB_MODE")
        if mode is None:
            online = not network_disabled() and url_reachable(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai"))
            mode = "online" if online else "offline"
        run.log_dir.mkdir(parents=True, exist_ok=True)
        self._run = wandb.init(project=run.project, name=run.experiment, config=run.config,
                               dir=str(run.log_dir), mode=mode)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self._run.log(metrics, step=step)

    def finish(self) -> None:
        self._run.finish()


# ---------------------------------------------------------------- console

# What the per-step table shows (fnmatch patterns, in display order); everything goes to the other backends.
CONSOLE_KEYS = [
    "critic/score/mean", "critic/reward_baseline/mean", "critic/rewards/mean", "critic/advantages/mean",
    "critic/vf_loss",
    "actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm", "actor/pg_clipfrac", "actor/lr",
    "response_length/mean", "response_length/clip_ratio", "prompt_length/mean",
    "timing_s/step", "timing_s/gen", "timing_s/update_actor", "timing_s/ref", "timing_s/update_critic",
    "perf/throughput", "perf/mfu", "memory/*/rss_peak_gb", "memory/*/cuda_peak_allocated_gb", "val/*",
]
CONSOLE_FALLBACK_ROWS = 16  # when none of CONSOLE_KEYS is present, the first keys alphabetically
# Console row labels by key prefix (default: the key's first part). The field's names put the reward and
# advantage statistics under `critic/` even without a critic (GRPO); the table shows them as "reward", so
# a "critic" row means a real value model. Metric keys in the files are unchanged.
CONSOLE_GROUPS = {"critic/score/": "reward", "critic/rewards/": "reward", "critic/advantages/": "reward",
                  "critic/returns/": "reward", "critic/reward_baseline/": "reward"}


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

        title = title or f"step {step}" + (f"/{self.total}" if self.total else "")
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

    def eta_line(self, step: int) -> str:
        now = time.monotonic()
        if self._first is None:
            self._first = (step, now)
        line = f"step {step}" + (f"/{self.total}" if self.total else "") + f"  elapsed {now - self._start:.0f}s"
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


# ---------------------------------------------------------------- facade


class Tracking:
    """Fan metrics out to several backends: `with Tracking(["console", "jsonl"], ...) as t: t.log(m, step)`."""

    def __init__(
        self,
        backends: list[str] | str,
        project: str = "rlkit",
        experiment: str = "run",
        log_dir: str | Path | None = None,
        total_steps: int | None = None,
        config: Any = None,
    ) -> None:
        names = [backends] if isinstance(backends, str) else list(backends)
        classes = [TRACKERS.get(name) for name in names]  # unknown names fail before anything starts
        run = RunInfo(project, experiment, Path(log_dir or Path("logs") / project / experiment),
                      total_steps, plain_config(config))
        self.run = run
        self.trackers: list[Tracker] = []
        try:
            for cls in dict.fromkeys(classes):  # "file" and "jsonl" are one backend
                self.trackers.append(cls(run))
        except BaseException:
            self.finish()
            raise
        self._finished = False

    def progress(self, phase: str, done: int, total: int) -> None:
        """Progress inside a step (e.g. validation prompts done / total) for the backends that show it."""
        for tracker in self.trackers:
            if hasattr(tracker, "progress"):
                tracker.progress(phase, done, total)

    def log(self, metrics: dict[str, Any], step: int) -> dict[str, float]:
        """Reduce `metrics` to floats and send them to every backend; returns what was logged."""
        reduced = to_floats(metrics)
        for tracker in self.trackers:
            tracker.log(reduced, step)
        return reduced

    def rewind(self, step: int) -> None:
        """After a resume from `step`: backends that can (jsonl, tensorboard) forget what they logged after
        it, so replayed steps are not recorded twice. wandb cannot rewrite history; its rows stay."""
        for tracker in self.trackers:
            if hasattr(tracker, "rewind"):
                dropped = tracker.rewind(step)
                if dropped:
                    log.warning("%s: dropped %d rows logged after step %d (they are replayed after the resume)",
                                getattr(tracker, "path", type(tracker).__name__), dropped, step)

    def finish(self) -> None:
        """Close every backend once (safe to call twice)."""
        if getattr(self, "_finished", False):
            return
        self._finished = True
        for tracker in self.trackers:
            tracker.finish()

    def __enter__(self) -> Tracking:
        return self

    def __exit__(self, *exc: object) -> None:
        self.finish()
