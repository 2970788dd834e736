"""Experiment trackers behind one facade: `Tracking(["console", "jsonl"], ...).log(metrics, step)`.

Backends are looked up by name in `TRACKERS` (the names written in `trainer.logger`), so a
new one is a class plus a decorator. Metrics arrive as floats, tensors or lists (per-sample
values from `Batch.meta["metrics"]`); the facade reduces everything to one float per key
before any backend sees it, so all backends log identical numbers.

`trainer.logger` is one name or a list (verl's forms): console, file (alias jsonl), tensorboard, wandb,
mlflow, swanlab. A backend that needs a package declares it (`packages`, `install`); `rlkit train`'s
pre-flight names a missing one with its pip command before Ray starts (`missing_tracker_packages`).
Validation generations (`trainer.log_val_generations`) reach every backend that has `log_generations`:
rows of {input, output, score} per validation step, as a table where the backend has one.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import importlib
import importlib.util
import json
import logging
import math
import os
import re
import time
from collections.abc import Sequence
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

#: one validation generation as the trackers log it: {"input": str, "output": str, "score": float}
Generation = dict[str, Any]
GENERATION_COLUMNS = ("step", "input", "output", "score")


def importable(module: str) -> bool:
    """Whether `module` can be imported, without importing it (cheap enough for a pre-flight)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a module stubbed out as None
        return False


def tracker_names(backends: Sequence[str] | str) -> list[str]:
    """`trainer.logger` as a list: one name (`console`) or a list of names."""
    return [backends] if isinstance(backends, str) else [str(b) for b in backends]


def missing_tracker_packages(backends: Sequence[str] | str) -> list[str]:
    """One line per tracker of `trainer.logger` whose package is not installed, with the pip command."""
    problems = []
    for name in dict.fromkeys(tracker_names(backends)):
        cls = TRACKERS.get(name)
        for module in getattr(cls, "packages", ()):
            if not importable(module):
                problems.append(f"trainer.logger: tracker '{name}' needs the {module} package, which is not "
                                f"installed: {cls.install}, or drop '{name}' from trainer.logger")
    return problems


def _import(module: str, tracker: type) -> Any:
    """The tracker's package, or the one-line UserError `missing_tracker_packages` gives."""
    try:
        return importlib.import_module(module)
    except ImportError:
        name = next((n for n in TRACKERS.names() if TRACKERS.get(n) is tracker), tracker.__name__)
        raise UserError(f"tracker '{name}' needs the {module} package: {tracker.install}, or drop it from "
                        "trainer.logger") from None


def generation_rows(samples: Sequence[Generation], step: int) -> list[list[Any]]:
    """The samples as table rows, in GENERATION_COLUMNS order."""
    return [[step, s.get("input"), s.get("output"), s.get("score")] for s in samples]


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
    """One JSON object per step in `<log_dir>/metrics.jsonl`, flushed at once (a crash loses nothing);
    validation generations one per line in `<log_dir>/val_generations.jsonl` ({step, input, output, score}).

    Non-finite values are written as null so every line is strict JSON.
    """

    GENERATIONS = "val_generations.jsonl"

    def __init__(self, run: RunInfo) -> None:
        run.log_dir.mkdir(parents=True, exist_ok=True)
        self.path = run.log_dir / "metrics.jsonl"
        self.generations_path = run.log_dir / self.GENERATIONS
        self._file = open(self.path, "a", encoding="utf-8")

    def log(self, metrics: dict[str, float], step: int) -> None:
        row = {"step": step, "time": round(time.time(), 3)}
        row.update({k: (v if math.isfinite(v) else None) for k, v in metrics.items()})
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()

    def log_generations(self, samples: Sequence[Generation], step: int) -> None:
        with open(self.generations_path, "a", encoding="utf-8") as f:
            for row in generation_rows(samples, step):
                f.write(json.dumps(dict(zip(GENERATION_COLUMNS, row)), ensure_ascii=False, default=str) + "\n")

    def rewind(self, step: int) -> int:
        """Drop the rows after `step` (and a torn last line), so the steps a resumed run replays appear
        once; returns how many metric rows were dropped. The files are replaced atomically."""
        self._file.close()
        dropped = rewind_jsonl(self.path, step)
        rewind_jsonl(self.generations_path, step)
        self._file = open(self.path, "a", encoding="utf-8")
        return dropped

    def finish(self) -> None:
        if not self._file.closed:
            self._file.close()


def rewind_jsonl(path: Path, step: int) -> int:
    """Keep the rows of a jsonl file whose `step` is <= `step`; returns how many were dropped."""
    if not path.exists():
        return 0
    kept, dropped = [], 0
    with open(path, encoding="utf-8") as f:
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
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        tmp.write_text("".join(kept), encoding="utf-8")
        os.replace(tmp, path)
    return dropped


# ---------------------------------------------------------------- tensorboard


@TRACKERS.register("tensorboard")
class TensorboardTracker:
    """Scalars under `<log_dir>/tensorboard`; the config and validation generations go in as text."""

    packages = ("tensorboard",)
    install = "pip install 'rlkit[tracking]' (or pip install tensorboard)"

    def __init__(self, run: RunInfo) -> None:
        _import("tensorboard", type(self))
        from torch.utils.tensorboard import SummaryWriter

        self.dir = run.log_dir / "tensorboard"
        self._writer_cls = SummaryWriter
        self._writer = SummaryWriter(log_dir=str(self.dir))
        if run.config:
            self._writer.add_text("config", "```\n" + json.dumps(run.config, indent=2) + "\n```", 0)

    def log(self, metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            self._writer.add_scalar(key, value, step)
        self._writer.flush()

    def log_generations(self, samples: Sequence[Generation], step: int) -> None:
        parts = [f"**step {step}**"]
        for i, (_, inp, out, score) in enumerate(generation_rows(samples, step), 1):
            parts.append(f"### sample {i} (score {score})\n**input:** {inp}\n\n**output:** {out}")
        self._writer.add_text("val/generations", "\n\n---\n\n".join(parts), step)
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

    packages = ("wandb",)
    install = "pip install 'rlkit[wandb]' (or pip install wandb)"

    def __init__(self, run: RunInfo) -> None:
        wandb = _import("wandb", type(self))
        from rlkit.utils.network import network_disabled, url_reachable

        mode = os.environ.get("WANDB_MODE")
        if mode is None:
            online = not network_disabled() and url_reachable(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai"))
            mode = "online" if online else "offline"
        run.log_dir.mkdir(parents=True, exist_ok=True)
        self._wandb = wandb
        self._run = wandb.init(project=run.project, name=run.experiment, config=run.config,
                               dir=str(run.log_dir), mode=mode)
        self._generations: list[list[Any]] = []

    def log(self, metrics: dict[str, float], step: int) -> None:
        self._run.log(metrics, step=step)

    def log_generations(self, samples: Sequence[Generation], step: int) -> None:
        """One table `val/generations` with the rows of every validation so far (a logged wandb.Table is
        immutable, so each validation logs a new one holding all rows)."""
        self._generations.extend(generation_rows(samples, step))
        table = self._wandb.Table(columns=list(GENERATION_COLUMNS), data=[list(r) for r in self._generations])
        self._run.log({"val/generations": table}, step=step)

    def finish(self) -> None:
        self._run.finish()


# ---------------------------------------------------------------- mlflow

MLFLOW_PARAM_CHARS = 6000  # MLflow's longest param value


@TRACKERS.register("mlflow")
class MlflowTracker:
    """MLflow: experiment `trainer.project_name`, run `trainer.experiment_name`, the config flattened into
    params (`actor_rollout_ref/actor/optim/lr`), metrics per step, validation generations as a table artifact
    per validation (`val_generations/step_<N>.json`). Where: `MLFLOW_TRACKING_URI` if set, else a local
    file store `<log_dir>/mlruns` (browse it with `mlflow ui --backend-store-uri <log_dir>/mlruns`)."""

    packages = ("mlflow",)
    install = "pip install 'rlkit[tracking]' (or pip install mlflow)"

    def __init__(self, run: RunInfo) -> None:
        mlflow = _import("mlflow", type(self))
        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if uri is None:
            run.log_dir.mkdir(parents=True, exist_ok=True)
            uri = (run.log_dir / "mlruns").resolve().as_uri()
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 refuses a file store otherwise
        self.uri = uri
        self._client = mlflow.MlflowClient(tracking_uri=uri)
        experiment = self._client.get_experiment_by_name(run.project)
        experiment_id = experiment.experiment_id if experiment else self._client.create_experiment(run.project)
        self.run_id = self._client.create_run(experiment_id, run_name=run.experiment).info.run_id
        params = [mlflow.entities.Param(k, v) for k, v in flat_params(run.config).items()]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            self._client.log_batch(self.run_id, params=params[i:i + 100])

    def log(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        rows = [Metric(mlflow_key(k), v, now, step) for k, v in metrics.items()]
        for i in range(0, len(rows), 1000):  # and at most 1000 metrics
            self._client.log_batch(self.run_id, metrics=rows[i:i + 1000])

    def log_generations(self, samples: Sequence[Generation], step: int) -> None:
        rows = generation_rows(samples, step)
        table = {col: [r[i] for r in rows] for i, col in enumerate(GENERATION_COLUMNS)}
        self._client.log_table(self.run_id, table, f"val_generations/step_{step}.json")

    def finish(self) -> None:
        self._client.set_terminated(self.run_id)


def mlflow_key(key: str) -> str:
    """A metric name MLflow accepts (letters, digits, `_-. /`): `@` reads `_at_` (verl's), others become `_`."""
    return re.sub(r"[^\w\-. /]", "_", key.replace("@", "_at_"))


def flat_params(config: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """A nested config as `a/b/c` -> value text (lists as JSON), cut to MLflow's longest param value."""
    out: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{mlflow_key(str(key))}"
        if isinstance(value, dict) and value:
            out.update(flat_params(value, f"{name}/"))
        else:
            text = value if isinstance(value, str) else json.dumps(value, default=str)
            out[name] = text[:MLFLOW_PARAM_CHARS]
    return out


# ---------------------------------------------------------------- swanlab


@TRACKERS.register("swanlab")
class SwanlabTracker:
    """SwanLab: project `trainer.project_name`, experiment `trainer.experiment_name`, logs under `SWANLAB_LOG_DIR`
    (default `<log_dir>/swanlog`). Mode: `SWANLAB_MODE` if set, else cloud when swanlab.cn is reachable
    (`SWANLAB_API_KEY` logs in) and offline otherwise; validation generations as an echarts table."""

    packages = ("swanlab",)
    install = "pip install swanlab"

    def __init__(self, run: RunInfo) -> None:
        swanlab = _import("swanlab", type(self))
        from rlkit.utils.network import network_disabled, url_reachable

        if os.environ.get("SWANLAB_API_KEY"):
            swanlab.login(os.environ["SWANLAB_API_KEY"])
        mode = os.environ.get("SWANLAB_MODE")
        if mode is None:
            online = not network_disabled() and url_reachable("https://swanlab.cn")
            mode = "cloud" if online else "offline"
        self._swanlab = swanlab
        swanlab.init(project=run.project, experiment_name=run.experiment, config=run.config,
                     logdir=os.environ.get("SWANLAB_LOG_DIR") or str(run.log_dir / "swanlog"), mode=mode)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self._swanlab.log(metrics, step=step)

    def log_generations(self, samples: Sequence[Generation], step: int) -> None:
        table = self._swanlab.echarts.Table()
        table.add(list(GENERATION_COLUMNS), generation_rows(samples, step))
        self._swanlab.log({"val/generations": table}, step=step)

    def finish(self) -> None:
        self._swanlab.finish()


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
        names = tracker_names(backends)
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

    def log_generations(self, samples: Sequence[Generation], step: int) -> None:
        """Validation generations ({input, output, score} each) to every backend that logs them."""
        for tracker in self.trackers:
            if hasattr(tracker, "log_generations"):
                tracker.log_generations(samples, step)

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
