"""Is a checkpoint folder loadable? The COMPLETE marker, its file list, and the DCP shard index.

A checkpoint is published only after `verify_new_checkpoint` found every file the trainer
expects and every shard its DCP `.metadata` refers to; the marker then records each file's
size. Later, `checkpoint_problem` re-checks that list with `stat` alone (cheap enough for every
scan), so a shard deleted or truncated after the save makes the checkpoint "broken" instead of
the newest: rotation never keeps it in place of a good one and `resume_mode=auto` skips it.
A checkpoint that failed to load for another reason gets an UNLOADABLE file (see `mark_unloadable`).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

COMPLETE = "COMPLETE"  # marker file written last into a checkpoint, just before it is published
UNLOADABLE = "UNLOADABLE"  # written into a checkpoint that failed to load while an older one loaded
DCP_METADATA = ".metadata"  # torch.distributed.checkpoint's index of a sharded state dict


def file_sizes(root: Path) -> dict[str, int]:
    """Every file under `root` (relative POSIX path -> size in bytes), markers excluded."""
    sizes = {}
    for dirpath, _, files in os.walk(root):
        for name in files:
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            if rel not in (COMPLETE, UNLOADABLE):
                sizes[rel] = path.stat().st_size
    return dict(sorted(sizes.items()))


def dcp_problems(folder: Path, label: str | None = None) -> list[str]:
    """What is missing from a DCP folder: the shard files (and byte ranges) its `.metadata` refers to.
    Paths in the messages start with `label` (default: the folder's name)."""
    from torch.distributed.checkpoint import FileSystemReader

    label = folder.name if label is None else label

    try:
        metadata = FileSystemReader(str(folder)).read_metadata()
    except Exception as exc:  # a torn or foreign .metadata: unpickling raises anything
        return [f"{label}/{DCP_METADATA} is unreadable ({type(exc).__name__}: {exc})"]
    needed: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        rel = getattr(info, "relative_path", None)
        if rel is not None:
            needed[rel] = max(needed.get(rel, 0), int(info.offset) + int(info.length))
    problems = []
    for rel, end in sorted(needed.items()):
        path = folder / rel
        if not path.is_file():
            problems.append(f"{label}/{rel} is missing")
        elif path.stat().st_size < end:
            problems.append(f"{label}/{rel} is truncated ({path.stat().st_size} of {end} bytes)")
    return problems


def verify_new_checkpoint(folder: Path, required: Iterable[str] = ()) -> list[str]:
    """Problems of a freshly written checkpoint (empty = complete): the `required` files and every DCP shard."""
    problems = [f"{rel} is missing" for rel in required if not (folder / rel).is_file()]
    for meta in sorted(folder.rglob(DCP_METADATA)):
        problems += dcp_problems(meta.parent, meta.parent.relative_to(folder).as_posix())
    return problems


def write_marker(folder: Path, step: int) -> None:
    """The COMPLETE marker: step, time and the size of every file (written last, fsynced by the caller)."""
    marker = {"step": step, "time": time.time(), "files": file_sizes(folder)}
    (folder / COMPLETE).write_text(json.dumps(marker, indent=0))


def read_marker(folder: Path) -> dict[str, Any] | None:
    """The marker's content; {} for a marker without a file list (older rlkit), None when there is none."""
    try:
        text = (folder / COMPLETE).read_text()
    except OSError:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def checkpoint_problem(folder: Path) -> str | None:
    """Why `folder` cannot be loaded (one phrase), or None when its marker and listed files are all there."""
    if not folder.is_dir():
        return "does not exist" if not folder.exists() else "is not a folder"
    marker = read_marker(folder)
    if marker is None:
        return f"has no {COMPLETE} marker (interrupted while saving, or not written by rlkit)"
    if (folder / UNLOADABLE).is_file():
        reason = (folder / UNLOADABLE).read_text(errors="replace").strip().splitlines() or ["unknown error"]
        return f"failed to load before ({reason[0]}); delete {UNLOADABLE} in it to try again"
    for rel, size in (marker.get("files") or {}).items():
        path = folder / rel
        try:
            actual = path.stat().st_size
        except OSError:
            return f"{rel} is missing (listed in {COMPLETE})"
        if actual != size:
            return f"{rel} has {actual} bytes, {COMPLETE} recorded {size}"
    return None


def mark_unloadable(folder: Path, reason: str) -> None:
    """Record that `folder` failed to load, so rotation and `resume_mode=auto` stop treating it as good."""
    try:
        (folder / UNLOADABLE).write_text(reason.strip() + "\n")
    except OSError:  # a read-only checkpoint folder: the caller already said what happened
        pass


ERROR_LINE = re.compile(r"^[\w.]*(Error|Exception)\b[^:]*:")


def short_reason(exc: BaseException, limit: int = 120) -> str:
    """The gist of an error in one line: the last `SomeError: message` line of its text (a worker's
    or DCP's traceback), else its last line; cut to `limit` characters."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    named = [line for line in lines if ERROR_LINE.match(line)]
    text = (named or lines or [type(exc).__name__])[-1]
    if not named and lines:
        text = f"{type(exc).__name__}: {text}"
    return text if len(text) <= limit else text[: limit - 3] + "..."
