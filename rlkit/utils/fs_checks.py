"""Can we write there? Asked before the work, not after it (a run, an eval, a scoring pass).

Permission bits do not answer it (root ignores them; read-only mounts and full disks do not show in
them), so each check creates the folder and writes a probe file, then removes it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from rlkit.errors import UserError


def _why(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def writable_dir_problem(path: str | Path) -> str | None:
    """None if `path` is (now) a folder we can create files in; else why not, in a few words."""
    path = Path(path).expanduser()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        return f"{path} exists and is not a folder"
    except OSError as exc:
        return f"cannot create {path} ({_why(exc)})"
    try:
        with tempfile.NamedTemporaryFile(dir=path, prefix=".rlkit-write-probe-") as probe:
            probe.write(b"x")
            probe.flush()
    except OSError as exc:
        return f"{path} is not writable ({_why(exc)})"
    return None


def ensure_writable_dir(path: str | Path, what: str) -> Path:
    """`path` as a writable folder (created if needed); UserError starting with `what` otherwise."""
    problem = writable_dir_problem(path)
    if problem is not None:
        raise UserError(f"{what}: {problem}; choose a writable folder")
    return Path(path).expanduser()


def ensure_writable_file(path: str | Path, what: str = "--out") -> Path:
    """Check that the file `path` can be written (its folder is created) before any work is done.

    An existing file is left as it is: writing a probe next to it tells whether the folder accepts
    new files, and the file itself must not be a folder or read-only.
    """
    path = Path(path).expanduser()
    if path.is_dir():
        raise UserError(f"{what} {path}: is a folder; pass a file path, e.g. {path / 'out.jsonl'}")
    problem = writable_dir_problem(path.parent)
    if problem is None and path.exists() and not os.access(path, os.W_OK):
        problem = f"{path} is read-only"
    if problem is not None:
        raise UserError(f"{what} {path}: {problem}; choose another {what}")
    return path


def free_bytes(path: str | Path) -> int:
    """Free space on the file system holding `path` (its nearest existing ancestor)."""
    path = Path(path).expanduser().absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"
