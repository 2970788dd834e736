"""Checkpoint directories: `<root>/global_step_N/`, published atomically, pruned, found again on resume.

Workers write their shards into a temp dir from `begin_checkpoint`; the driver then calls
`commit_checkpoint`, which marks it COMPLETE, fsyncs and renames it into place. A crash at any
point leaves either the previous checkpoints untouched or a temp dir that `find_latest_checkpoint`
ignores, so `resume_mode=auto` never loads half a checkpoint.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import time
import warnings
from pathlib import Path
from typing import Any

from rlkit.errors import UserError

PREFIX = "global_step_"
COMPLETE = "COMPLETE"  # marker file written into a checkpoint just before it is published
LATEST = "latest_checkpointed_iteration.txt"
STEP_DIR = re.compile(rf"^{PREFIX}(\d+)$")
TEMP_DIR = re.compile(rf"^{PREFIX}\d+\.(tmp|old|del)-(\d+)$")


def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"{PREFIX}{step}"


def step_of(path: str | Path) -> int | None:
    """N for a `global_step_N` folder, None for anything else (temp dirs included)."""
    match = STEP_DIR.match(Path(path).name)
    return int(match.group(1)) if match else None


def _fsync_path(path: Path) -> None:
    """fsync a file or directory (directories make renames durable; skipped where unsupported)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    for dirpath, _, files in os.walk(root):
        for name in files:
            _fsync_path(Path(dirpath) / name)
        _fsync_path(Path(dirpath))


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` to `path` so readers see the old or the new content, never a torn file."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_path(path.parent)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def begin_checkpoint(root: str | Path, step: int) -> Path:
    """A fresh temp dir `<root>/global_step_N.tmp-<pid>` for the shards of step N."""
    if step < 0:
        raise UserError(f"checkpoint step must be >= 0, got {step}")
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f"{PREFIX}{step}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    return tmp


def commit_checkpoint(root: str | Path, tmp: str | Path, step: int, keep_last: int | None = None) -> Path:
    """Publish `tmp` as `<root>/global_step_N`, point the latest file at it, then prune to `keep_last`.

    Order: COMPLETE marker -> fsync -> rename -> latest pointer -> delete the oldest. The new
    checkpoint is never deleted, whatever its step.
    """
    root, tmp = Path(root), Path(tmp)
    if keep_last is not None and keep_last < 1:
        raise UserError(f"keep_last must be >= 1 (or None to keep all), got {keep_last}")
    if not tmp.is_dir() or tmp.parent.resolve() != root.resolve():
        raise UserError(f"{tmp} is not a checkpoint temp dir inside {root}; get one from begin_checkpoint()")
    final = step_dir(root, step)
    (tmp / COMPLETE).write_text(json.dumps({"step": step, "time": time.time()}))
    _fsync_tree(tmp)
    if final.exists():  # saving the same step again (e.g. after a resume): swap, then drop the old one
        old = root / f"{PREFIX}{step}.old-{os.getpid()}"
        os.rename(final, old)
        os.rename(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, final)
    _fsync_path(root)
    atomic_write_text(root / LATEST, f"{step}\n")
    if keep_last is not None:
        prune_checkpoints(root, keep_last, keep=final)
    _remove_stale_temp_dirs(root)
    return final


def prune_checkpoints(root: str | Path, keep_last: int, keep: Path | None = None) -> list[Path]:
    """Delete complete checkpoints beyond the `keep_last` highest steps (never `keep`); returns the deleted."""
    checkpoints = list_checkpoints(root)
    protected = {keep.resolve()} if keep else set()
    doomed = [p for _, p in checkpoints[:-keep_last] if p.resolve() not in protected]
    for path in doomed:
        # Rename first, so a crash mid-delete leaves no folder that looks like a checkpoint.
        trash = path.with_name(f"{path.name}.del-{os.getpid()}")
        os.rename(path, trash)
        shutil.rmtree(trash, ignore_errors=True)
    return doomed


def _remove_stale_temp_dirs(root: Path) -> None:
    """Temp dirs left by crashed processes (their pid is gone) are garbage."""
    for path in root.iterdir():
        match = TEMP_DIR.match(path.name)
        if match and int(match.group(2)) != os.getpid() and not _pid_alive(int(match.group(2))):
            shutil.rmtree(path, ignore_errors=True)


def is_complete(path: Path) -> bool:
    return step_of(path) is not None and path.is_dir() and (path / COMPLETE).is_file()


def list_checkpoints(root: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints under `root` as (step, path), oldest step first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [(step_of(p), p) for p in root.iterdir() if is_complete(p)]
    return sorted((s, p) for s, p in found if s is not None)


def find_latest_checkpoint(root: str | Path) -> Path | None:
    """The checkpoint the latest pointer names if it is complete, else the highest complete step, else None."""
    root = Path(root)
    try:
        pointed = step_dir(root, int((root / LATEST).read_text().strip()))
        if is_complete(pointed):
            return pointed
    except (OSError, ValueError):
        pass
    checkpoints = list_checkpoints(root)
    return checkpoints[-1][1] if checkpoints else None


def resolve_resume(root: str | Path, resume_mode: str | Path | None = "auto") -> Path | None:
    """The checkpoint to resume from: `auto` (latest under root, None if there is none), `disable`
    (None), or a path (a `global_step_N` folder, or a checkpoint root whose latest is used)."""
    if resume_mode is None or str(resume_mode) == "disable":
        return None
    if str(resume_mode) == "auto":
        return find_latest_checkpoint(root)
    path = Path(resume_mode).expanduser()
    if not path.exists():
        raise UserError(f"resume_mode: {path} does not exist; use auto, disable, or a global_step_N folder")
    if step_of(path) is None:
        latest = find_latest_checkpoint(path) if path.is_dir() else None
        if latest is None:
            raise UserError(f"resume_mode: {path} is neither a {PREFIX}N folder nor a root holding complete ones")
        return latest
    if not is_complete(path):
        others = ", ".join(p.name for _, p in list_checkpoints(path.parent)) or "none"
        raise UserError(f"resume_mode: {path} has no {COMPLETE} marker (interrupted while saving); "
                        f"complete checkpoints next to it: {others}")
    return path


# ---------------------------------------------------------------- RNG state


def save_rng_state() -> dict[str, Any]:
    """Python, numpy, torch (and CUDA) RNG states as builtin types only, so it pickles and
    loads under `torch.load(weights_only=True)`."""
    import numpy as np
    import torch

    np_state = np.random.get_state(legacy=False)
    state: dict[str, Any] = {
        "python": _to_builtin(random.getstate()),
        "numpy": {"bit_generator": np_state["bit_generator"], "key": np_state["state"]["key"].tolist(),
                  "pos": int(np_state["state"]["pos"]), "has_gauss": int(np_state["has_gauss"]),
                  "gauss": float(np_state["gauss"])},
        "torch": torch.get_rng_state().tolist(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = [s.tolist() for s in torch.cuda.get_rng_state_all()]
    return state


def load_rng_state(state: dict[str, Any]) -> None:
    """Restore what `save_rng_state` captured (keys that are absent are left alone)."""
    import numpy as np
    import torch

    if "python" in state:
        version, internal, gauss = state["python"]
        random.setstate((version, tuple(internal), gauss))
    if "numpy" in state:
        s = state["numpy"]
        np.random.set_state((s["bit_generator"], np.array(s["key"], dtype=np.uint32), s["pos"], s["has_gauss"],
                             s["gauss"]))
    if "torch" in state:
        torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))
    if "cuda" in state:
        if torch.cuda.is_available() and torch.cuda.device_count() == len(state["cuda"]):
            torch.cuda.set_rng_state_all([torch.tensor(s, dtype=torch.uint8) for s in state["cuda"]])
        else:
            warnings.warn("checkpoint has CUDA RNG state for a different device count; not restored", stacklevel=2)


def _to_builtin(value: Any) -> Any:
    return [_to_builtin(v) for v in value] if isinstance(value, (tuple, list)) else value
