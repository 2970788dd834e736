"""The built-in tracker backends besides the console: file (jsonl), tensorboard, wandb, mlflow, swanlab.

Each registers itself in `TRACKERS` on import; one whose package is optional imports it only when built,
so this module imports cheaply.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlkit.utils.tracker_base import (
    GENERATION_COLUMNS,
    TRACKERS,
    Generation,
    RunInfo,
    generation_rows,
    import_backend,
)

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
        import_backend("tensorboard", type(self))
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
    """Weights & Biases (installed by rlkit's default set-up). Without an API key or a reachable server it logs
    offline under `<log_dir>/wandb/` and says in one line how to upload it (rlkit.utils.wandb_mode)."""

    packages = ("wandb",)
    install = "pip install 'rlkit[wandb]' (or pip install wandb)"

    def __init__(self, run: RunInfo) -> None:
        wandb = import_backend("wandb", type(self))
        from rlkit.utils.wandb_mode import choose_mode, offline_line

        mode, why = choose_mode()
        run.log_dir.mkdir(parents=True, exist_ok=True)
        self._wandb = wandb
        self._run = wandb.init(project=run.project, name=run.experiment, config=run.config,
                               dir=str(run.log_dir), mode=mode)
        self.run_dir = Path(self._run.dir).parent  # <log_dir>/wandb/<offline-run-...>: what `wandb sync` takes
        if mode == "offline":
            logging.getLogger("rlkit.tracking").warning(offline_line(why, self.run_dir))
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
        """The run, then wandb's service process: left to wandb's exit hook, a run that failed printed a
        traceback ("Connection lost") after its one error line, the service being gone by then."""
        self._run.finish()
        self._wandb.teardown()


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
        mlflow = import_backend("mlflow", type(self))
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
        swanlab = import_backend("swanlab", type(self))
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
