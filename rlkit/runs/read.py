"""Reading a run folder as `rlkit runs` / `show` / `top` see it: its status, metrics rows and latest samples.

A run folder is where the driver wrote `status.json` (`trainer.default_local_dir`); a folder of an older run without
one still counts when it has `logs/metrics.jsonl`. Nothing here writes, so a reader never disturbs a run.
"""

from __future__ import annotations

import fnmatch
import json
import math
import os
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rlkit.errors import UserError
from rlkit.runs.status import FAILED, FINISHED, INTERRUPTED, RUNNING, STATUS_FILE, read_status

METRICS_FILE = "metrics.jsonl"
SKIP_DIRS = ("global_step_", "steps", "logs", "tensorboard", "wandb", "mlruns", "swanlog", ".")
MAX_DEPTH = 6
REWARD_KEY = "critic/score/mean"
OUTCOME_WORDS = ("score", "acc", "loss", "reward", "pass", "best", "maj")  # validation keys a before/after shows
VAL_SCORE_GLOBS = ("val/*score/mean*", "val-core/*", "val/loss")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def find_runs(root: Path) -> list[Path]:
    """Run folders under `root` (itself included), sorted by path; checkpoint and log folders are not entered."""
    root = Path(root).expanduser()
    if not root.is_dir():
        raise UserError(f"{root}: no such folder; pass the folder your runs are in (trainer.default_local_dir's "
                        "parent, e.g. `rlkit runs checkpoints`)")
    found = []
    for folder, dirs, files in os.walk(root):
        here = Path(folder)
        depth = len(here.relative_to(root).parts)
        if STATUS_FILE in files or (here / "logs" / METRICS_FILE).is_file():
            found.append(here)
        dirs[:] = [] if depth >= MAX_DEPTH else sorted(d for d in dirs if not d.startswith(SKIP_DIRS))
    return sorted(found)


def resolve_run(name: str | Path, root: Path | None = None) -> Path:
    """A run folder from a path, or a name under `root` (the last part of its path, if only one run has it)."""
    path = Path(name).expanduser()
    if path.is_dir() and (path in find_runs(path)[:1] or (path / STATUS_FILE).is_file()):
        return path
    if root is not None and Path(root).expanduser().is_dir():
        matches = [r for r in find_runs(Path(root)) if r.name == str(name) or str(r).endswith(f"/{name}")]
        if len(matches) == 1:
            return matches[0]
        if matches:
            raise UserError(f"run '{name}' matches {len(matches)} runs under {root}: "
                            f"{', '.join(str(m) for m in matches)}; pass the path")
    raise UserError(f"{name}: not a run folder (none has status.json or logs/metrics.jsonl); `rlkit runs` lists them")


def log_dir_of(folder: Path, status: dict[str, Any] | None) -> Path:
    logged = (status or {}).get("log_dir")
    return Path(logged) if logged else Path(folder) / "logs"


def read_rows(log_dir: Path) -> list[dict[str, Any]]:
    """The metrics rows (a torn last line, being written, is left out)."""
    path = Path(log_dir) / METRICS_FILE
    rows = []
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return []
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def last_value(rows: list[dict[str, Any]], patterns: tuple[str, ...] | str) -> tuple[str, float] | None:
    """The newest finite value of the first key matching `patterns` (globs), with the key."""
    patterns = (patterns,) if isinstance(patterns, str) else patterns
    for row in reversed(rows):
        for pattern in patterns:
            for key in sorted(row):
                value = row[key]
                if fnmatch.fnmatchcase(key, pattern) and isinstance(value, (int, float)) and math.isfinite(value):
                    return key, float(value)
    return None


@dataclass
class RunRow:
    """One line of `rlkit runs`."""

    name: str
    trainer: str
    status: str
    step: int
    total: int | None
    reward: float | None
    val_score: float | None
    val_key: str | None
    elapsed_s: float | None
    precision: str | None
    path: str
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def run_state(status: dict[str, Any] | None, rows: list[dict[str, Any]]) -> str:
    """running / finished / failed / interrupted: the driver's own word, unless it says running and its process is
    gone (killed: interrupted). A folder without a status file (an older run) is `unknown`."""
    if status is None:
        return "unknown"
    state = status.get("state", "unknown")
    if state == RUNNING and status.get("host") == socket.gethostname() and not pid_alive(int(status.get("pid", 0))):
        return INTERRUPTED
    return state if state in (RUNNING, FINISHED, FAILED, INTERRUPTED) else "unknown"


def summarize(folder: Path, root: Path | None = None) -> RunRow:
    status = read_status(folder)
    rows = read_rows(log_dir_of(folder, status))
    train = [r for r in rows if REWARD_KEY in r or "train/loss" in r]
    reward = last_value(train, REWARD_KEY)
    val = last_value(rows, VAL_SCORE_GLOBS)
    state = run_state(status, rows)
    step = int((status or {}).get("step") or max((int(r.get("step", 0)) for r in rows), default=0))
    elapsed = None
    if status and status.get("started_at"):
        end = time.time() if state == RUNNING else float(status.get("updated_at") or time.time())
        elapsed = max(0.0, end - float(status["started_at"]))
    elif len(rows) > 1 and "time" in rows[0]:
        elapsed = float(rows[-1]["time"]) - float(rows[0]["time"])
    name = str(folder.relative_to(root)) if root is not None and folder != root and folder.is_relative_to(root) \
        else folder.name
    return RunRow(
        name=name, trainer=str((status or {}).get("trainer", "?")), status=state, step=step,
        total=(status or {}).get("total"), reward=reward[1] if reward else None, val_score=val[1] if val else None,
        val_key=val[0] if val else None, elapsed_s=elapsed, precision=(status or {}).get("precision"),
        path=str(folder), error=(status or {}).get("error"),
    )


def latest_samples(folder: Path, limit: int = 3, status: dict[str, Any] | None = None,
                   config: dict[str, Any] | None = None) -> tuple[str, list[dict[str, Any]]]:
    """(where, rows) of the newest samples a run wrote: its rollout dump (`trainer.rollout_data_dir`), else its
    validation dump, else the validation generations the jsonl tracker logged; rows have input/output/score/step."""
    status = status if status is not None else read_status(folder)
    config = config if config is not None else ({} if status else run_config(folder))
    trainer_cfg = config.get("trainer", {}) if isinstance(config, dict) else {}
    for key in ("rollout_data_dir", "validation_data_dir"):
        dump = (status or {}).get(key) or trainer_cfg.get(key)
        if dump and Path(dump).is_dir():
            files = sorted(Path(dump).glob("*.jsonl"), key=lambda p: int(p.stem) if p.stem.isdigit() else -1)
            if files:
                return f"{files[-1]}", _jsonl(files[-1])[:limit]
    generations = log_dir_of(folder, status) / "val_generations.jsonl"
    rows = _jsonl(generations)
    if rows:
        last = rows[-1].get("step")
        return str(generations), [r for r in rows if r.get("step") == last][:limit]
    return "", []


def run_config(folder: Path) -> dict[str, Any]:
    """The run's config as its newest checkpoint saved it ({} before the first checkpoint)."""
    checkpoints = sorted(Path(folder).glob("global_step_*/config.json"),
                         key=lambda p: int(p.parent.name.rsplit("_", 1)[1]) if p.parent.name[12:].isdigit() else -1)
    if not checkpoints:
        return {}
    try:
        return json.loads(checkpoints[-1].read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _jsonl(path: Path) -> list[dict[str, Any]]:
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return [r for r in out if isinstance(r, dict)]


def format_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


def before_after(rows: list[dict[str, Any]]) -> list[tuple[str, float | None, float | None]]:
    """(metric, first, last) of the training reward (or loss) and of every validation score: a run's outcome."""
    out = []
    for key in (REWARD_KEY, "train/loss"):
        values = [float(r[key]) for r in rows if isinstance(r.get(key), (int, float))]
        if values:
            out.append((key, values[0], values[-1]))
    val_keys = sorted({k for r in rows for k in r
                       if k.startswith("val/") and any(w in k for w in OUTCOME_WORDS)})
    for key in val_keys:
        values = [float(r[key]) for r in rows if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
        if values:
            out.append((key, values[0], values[-1]))
    return out
