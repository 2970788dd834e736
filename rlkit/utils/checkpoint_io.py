"""Checkpoint directories: `<root>/global_step_N/`, verified, published atomically, pruned, found again on resume.

Workers write their shards into a temp dir from `begin_checkpoint`; the driver then calls
`commit_checkpoint`, which checks that every expected file and DCP shard is there, writes the
COMPLETE marker (with the size of every file) last, fsyncs and renames the dir into place, and
only then rotates old ones. A crash at any point leaves either the previous checkpoints untouched
or a temp dir that is ignored. Rotation counts only loadable checkpoints (`checkpoint_verify`), so
a broken newer one never pushes out the last good one; `load_with_fallback` resumes from the
newest checkpoint that actually loads and says which ones it skipped.
"""

from __future__ import annotations

import errno
import os
import random
import re
import shutil
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from rlkit.errors import UserError
from rlkit.utils.checkpoint_verify import (
    checkpoint_problem,
    mark_unloadable,
    short_reason,
    verify_new_checkpoint,
    write_marker,
)

PREFIX = "global_step_"
LATEST = "latest_checkpointed_iteration.txt"
STEP_DIR = re.compile(rf"^{PREFIX}(\d+)$")
TEMP_DIR = re.compile(rf"^{PREFIX}\d+\.(tmp|old|del)-(\d+)$")
RECORD_DIR = "steps"  # step records (rlkit/trainer/replay/step_record.py) live beside the checkpoints they replay from
RECORD_FILE = re.compile(r"^step_(\d+)\.pt$")
__all__ = ["CheckpointError", "begin_checkpoint", "commit_checkpoint", "load_with_fallback",
           "open_checkpoint", "resolve_resume", "list_checkpoints", "find_latest_checkpoint"]


class CheckpointError(UserError):
    """A checkpoint is missing, incomplete or unloadable; the message names the folder and the problem."""


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


def commit_checkpoint(
    root: str | Path, tmp: str | Path, step: int, keep_last: int | None = None, required: Iterable[str] = ()
) -> Path:
    """Publish `tmp` as `<root>/global_step_N`, point the latest file at it, then prune to `keep_last`.

    Order: verify (`required` files + DCP shards) -> COMPLETE marker -> fsync -> rename -> latest
    pointer -> delete the oldest loadable ones. An incomplete `tmp` raises CheckpointError before
    anything is renamed or deleted. The new checkpoint is never deleted, whatever its step.
    """
    root, tmp = Path(root), Path(tmp)
    if keep_last is not None and keep_last < 1:
        raise UserError(f"keep_last must be >= 1 (or None to keep all), got {keep_last}")
    if not tmp.is_dir() or tmp.parent.resolve() != root.resolve():
        raise UserError(f"{tmp} is not a checkpoint temp dir inside {root}; get one from begin_checkpoint()")
    problems = verify_new_checkpoint(tmp, required)
    if problems:
        raise CheckpointError(
            f"checkpoint of step {step} in {tmp} is incomplete ({'; '.join(problems[:3])}); it was not published "
            "and no older checkpoint was deleted"
        )
    final = step_dir(root, step)
    write_marker(tmp, step)
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


def replay_bases(root: str | Path, checkpoints: list[tuple[int, Path]]) -> set[Path]:
    """The checkpoint each step record in `<root>/steps/` replays from (the newest before its step): kept out of the
    rotation, so `rlkit debug replay` of a recorded step works however many checkpoints the run rotated away."""
    folder = Path(root) / RECORD_DIR
    steps = [int(m.group(1)) for p in folder.iterdir() if (m := RECORD_FILE.match(p.name))] if folder.is_dir() else []
    bases = set()
    for n in steps:
        before = [p for s, p in checkpoints if s < n]
        if before:
            bases.add(before[-1].resolve())
    return bases


DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def disk_full(exc: BaseException) -> bool:
    """Whether `exc` is the disk (or the quota) running out: an OSError here, or a worker's error carrying one."""
    if isinstance(exc, OSError):
        return exc.errno in DISK_FULL
    return any(f"[Errno {code}]" in str(exc) for code in DISK_FULL)


def abandon_checkpoint(root: str | Path, tmp: str | Path, step: int, exc: BaseException) -> CheckpointError:
    """The error of a checkpoint that could not be written for lack of space, after removing its temp dir (the
    space the partial copy took is freed; no older checkpoint was touched): one line saying what to do."""
    shutil.rmtree(tmp, ignore_errors=True)
    code = exc.errno if isinstance(exc, OSError) and exc.errno in DISK_FULL else errno.ENOSPC
    last = find_latest_checkpoint(root)
    kept = f"the last complete checkpoint {last} is intact" if last else "there is no earlier checkpoint"
    return CheckpointError(f"checkpoint of step {step} not written: {os.strerror(code)} under {root}; its partial "
                           f"copy was removed and {kept}; free some space (or set trainer.default_local_dir to "
                           "another disk) and resume with trainer.resume_mode=auto")


def prune_checkpoints(root: str | Path, keep_last: int, keep: Path | None = None) -> list[Path]:
    """Delete loadable checkpoints beyond the `keep_last` highest steps (never `keep`, nor the checkpoint a step
    record replays from: `replay_bases`); returns the deleted.

    Broken ones (see `broken_checkpoints`) neither count towards `keep_last` nor get deleted: they
    cannot stand in for a good one, and their files may still be worth repairing.
    """
    checkpoints = list_checkpoints(root)
    protected = ({keep.resolve()} if keep else set()) | replay_bases(root, checkpoints)
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
    """A `global_step_N` folder whose marker and listed files are all there (and that never failed to load)."""
    return step_of(path) is not None and checkpoint_problem(Path(path)) is None


def _step_dirs(root: Path) -> list[tuple[int, Path]]:
    if not root.is_dir():
        return []
    found = [(step_of(p), p) for p in root.iterdir() if p.is_dir()]
    return sorted((s, p) for s, p in found if s is not None)


def list_checkpoints(root: str | Path) -> list[tuple[int, Path]]:
    """Loadable checkpoints under `root` as (step, path), oldest step first."""
    return [(s, p) for s, p in _step_dirs(Path(root)) if checkpoint_problem(p) is None]


def broken_checkpoints(root: str | Path) -> list[tuple[int, Path, str]]:
    """`global_step_N` folders under `root` that cannot be loaded, with the reason, oldest step first."""
    out = []
    for step, path in _step_dirs(Path(root)):
        problem = checkpoint_problem(path)
        if problem is not None:
            out.append((step, path, problem))
    return out


def find_latest_checkpoint(root: str | Path) -> Path | None:
    """The checkpoint the latest pointer names if it is loadable, else the highest loadable step, else None."""
    candidates = resume_candidates(root)
    return candidates[0] if candidates else None


def resume_candidates(root: str | Path) -> list[Path]:
    """Loadable checkpoints, best first: the one the latest pointer names, then by step, highest first."""
    root = Path(root)
    ordered = [p for _, p in reversed(list_checkpoints(root))]
    try:
        pointed = step_dir(root, int((root / LATEST).read_text().strip()))
    except (OSError, ValueError):
        return ordered
    if pointed in ordered:
        ordered.remove(pointed)
        ordered.insert(0, pointed)
    return ordered


def open_checkpoint(path: str | Path, what: str = "checkpoint") -> Path:
    """A loadable checkpoint from a `global_step_N` folder or a checkpoint root (its latest).

    Raises CheckpointError starting with `what` (the option or command that named the path) and
    naming the problem: missing, not a checkpoint, no marker, a listed shard gone.
    """
    path = Path(path).expanduser()
    if not path.exists():
        raise CheckpointError(f"{what}: {path} does not exist; pass a {PREFIX}N folder or the checkpoint root")
    if step_of(path) is None:
        latest = find_latest_checkpoint(path) if path.is_dir() else None
        if latest is not None:
            return latest
        broken = broken_checkpoints(path) if path.is_dir() else []
        if broken:
            _, bad, problem = broken[-1]
            raise CheckpointError(f"{what}: {path} holds no loadable checkpoint; {bad.name} {problem}")
        raise CheckpointError(f"{what}: {path} is neither a {PREFIX}N folder nor a root holding complete ones")
    problem = checkpoint_problem(path)
    if problem is not None:
        others = ", ".join(p.name for _, p in list_checkpoints(path.parent)) or "none"
        raise CheckpointError(f"{what}: {path} {problem}; loadable checkpoints next to it: {others}")
    return path


def resolve_resume(root: str | Path, resume_mode: str | Path | None = "auto") -> Path | None:
    """The checkpoint to resume from: `auto` (latest loadable under root, None if there is none), `disable`
    (None), or a path (a `global_step_N` folder, or a checkpoint root whose latest is used)."""
    if resume_mode is None or str(resume_mode) == "disable":
        return None
    if str(resume_mode) == "auto":
        return find_latest_checkpoint(root)
    return open_checkpoint(resume_mode, "trainer.resume_mode")


def load_with_fallback(
    root: str | Path, resume_mode: str | Path | None, load: Callable[[Path], None], say: Callable[[str], None]
) -> Path | None:
    """Resume: call `load(path)` on the checkpoint `resume_mode` picks; returns it (None = fresh start).

    With `auto`, broken checkpoints are skipped and a checkpoint whose `load` raises is marked
    UNLOADABLE once an older one has loaded; each skip is reported through `say` in one line.
    An explicit path that fails to load is a CheckpointError naming it and the error.
    """
    if resume_mode is None or str(resume_mode) == "disable":
        return None
    if str(resume_mode) != "auto":
        path = open_checkpoint(resume_mode, "trainer.resume_mode")
        try:
            load(path)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # DCP's CheckpointException is a BaseException
            raise CheckpointError(f"trainer.resume_mode: cannot load {path} ({short_reason(exc)}); pick another "
                                  f"checkpoint or trainer.resume_mode=disable") from exc
        return path
    candidates = resume_candidates(root)
    newest = step_of(candidates[0]) if candidates else None
    skipped = [(p, why) for step, p, why in broken_checkpoints(root) if newest is None or step > newest]
    for path, problem in skipped:
        say(f"trainer.resume_mode=auto: skipping {path}: {problem}")
    failed: list[tuple[Path, str]] = []
    for path in candidates:
        try:
            load(path)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # DCP's CheckpointException is a BaseException
            failed.append((path, short_reason(exc)))
            say(f"trainer.resume_mode=auto: cannot load {path} ({failed[-1][1]}); trying the previous checkpoint")
            continue
        for bad, reason in failed:  # an older one loads, so the newer failures are the checkpoints' fault
            mark_unloadable(bad, reason)
        if failed or skipped:
            say(f"trainer.resume_mode=auto: fell back to the previous complete checkpoint {path}")
        return path
    broken = broken_checkpoints(root)
    if failed or broken:
        names = [f"{p.name} ({why})" for p, why in failed] + [f"{p.name} ({why})" for _, p, why in broken]
        raise CheckpointError(f"trainer.resume_mode=auto: no checkpoint in {root} loads: {'; '.join(names[:3])}; "
                              "repair one, or start over with trainer.resume_mode=disable")
    return None


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
