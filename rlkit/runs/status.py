"""`<run folder>/status.json`: what a driver is doing now, for `rlkit runs` / `rlkit top` (and the Prometheus
endpoint) to read without asking the run anything.

The driver writes it atomically (a temporary file renamed over it) only when something a reader shows changes: the
phase, the step, the state; never per sample, so a run pays a few small writes per step. A write that fails (a
full disk, a read-only folder) is logged once and never stops the run.

Fields: `pid`, `host`, `trainer` (grpo, gae, sft, dpo...), `state` (running / finished / failed / interrupted),
`phase` (starting, gen, update_actor, validate, checkpoint...), `step`, `total`, `started_at`, `updated_at`,
`log_dir`, `precision`, `workers` ([{group, roles, rank, pid}]), `error` (the failure's one line).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

log = logging.getLogger("rlkit.runs")

STATUS_FILE = "status.json"
RUNNING, FINISHED, FAILED, INTERRUPTED = "running", "finished", "failed", "interrupted"


def write_atomic(path: Path, data: dict[str, Any]) -> None:
    """`data` as JSON at `path`, replaced in one rename: a reader sees the old file or the new one, never half."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(data, default=str), encoding="utf-8")
    os.replace(tmp, path)


def read_status(folder: Path) -> dict[str, Any] | None:
    """The status a run's driver last wrote (None: none, or unreadable)."""
    try:
        data = json.loads((Path(folder) / STATUS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


class RunStatus:
    """The writer: `begin()` once, `phase(name)` / `step(n)` as the run moves, `end(exc)` once."""

    def __init__(self, folder: Path, workers: Callable[[], list[dict[str, Any]]] | None = None, **fields: Any) -> None:
        self.path = Path(folder) / STATUS_FILE
        self._workers = workers  # read at each write: a worker restart's new processes show at the next phase
        self.data: dict[str, Any] = {
            "pid": os.getpid(), "host": socket.gethostname(), "state": RUNNING, "phase": "starting", "step": 0,
            "total": None, "started_at": round(time.time(), 3), **fields,
        }
        self._failed = False
        self.listeners: list[Callable[[dict[str, Any]], None]] = []  # with the data after each write (Prometheus)
        self.row_listeners: list[Callable[[dict[str, Any], int], None]] = []  # with each logged row and its step
        self.closers: list[Callable[[], None]] = []  # at the end (the endpoint's server)

    def begin(self) -> RunStatus:
        self._write()
        return self

    def update(self, **fields: Any) -> None:
        """Write when a field a reader shows has changed (a repeated phase costs nothing)."""
        if all(self.data.get(k) == v for k, v in fields.items()):
            return
        self.data.update(fields)
        self._write()

    def logged(self, row: dict[str, Any], step: int) -> None:
        """A row the trackers got: the step it belongs to (no write unless the step moved)."""
        for listener in self.row_listeners:
            listener(row, step)
        self.update(step=step)

    def phase(self, name: str) -> None:
        self.update(phase=name)

    @contextmanager
    def phased(self, name: str) -> Iterator[None]:
        """`with status.phased("validate"):` the phase for the block, then back to the one before."""
        before = self.data.get("phase")
        self.phase(name)
        try:
            yield
        finally:
            self.phase(before)

    def end(self, exc: BaseException | None, interrupted: bool = False) -> None:
        """The run's end: finished (no exception), interrupted (Ctrl-C, SIGTERM) or failed (its one line); the first
        call counts (the loop ends a finished run before its `finally` would look at the exception in flight)."""
        if self.data["state"] != RUNNING:
            return
        if exc is None:
            self.update(state=FINISHED, phase="done")
        elif interrupted or isinstance(exc, KeyboardInterrupt):
            self.update(state=INTERRUPTED, phase="stopped")
        else:
            line = str(exc).strip().splitlines()
            self.update(state=FAILED, phase="stopped", error=f"{type(exc).__name__}: {line[0] if line else ''}"[:500])
        for close in self.closers:
            close()

    def _write(self) -> None:
        self.data["updated_at"] = round(time.time(), 3)
        if self._workers is not None:
            try:
                self.data["workers"] = self._workers()
            except Exception as exc:  # a label: never a reason to stop a run
                log.debug("worker list unavailable: %s", exc)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(self.path, self.data)
        except OSError as exc:  # the status is for watching: never a reason to stop a run
            if not self._failed:
                log.warning("cannot write %s (rlkit runs/top will not see this run's phase): %s", self.path, exc)
            self._failed = True
        for listener in self.listeners:
            listener(self.data)


class PhaseTimer:
    """A step's `Timer` that also tells the status which phase the step is in (`with timer("gen"):`)."""

    def __init__(self, timer: Any, status: RunStatus | None) -> None:
        self._timer, self._status = timer, status

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        if self._status is not None:
            self._status.phase(name)
        with self._timer(name):
            yield

    def __getattr__(self, item: str) -> Any:
        return getattr(self._timer, item)


def worker_rows(workers: Any) -> list[dict[str, Any]]:
    """[{group, roles, rank, pid, node, ip}] of a trainer's worker groups (none when it has no Ray groups): the
    run's record of where each rank ran."""
    rows = []
    for group in getattr(workers, "groups", None) or []:
        roles = [r or "worker" for r in getattr(group, "roles", {})]
        nodes = getattr(group, "nodes", None) or []
        for rank, pid in enumerate(getattr(group, "pids", [])):
            row = {"group": getattr(group, "name_prefix", "?"), "roles": roles, "rank": rank, "pid": pid}
            if rank < len(nodes):
                row.update(node=nodes[rank].get("node_id"), ip=nodes[rank].get("ip"))
            rows.append(row)
    return rows
