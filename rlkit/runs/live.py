"""What `rlkit top` shows at one moment, gathered from what the run publishes (its status file, its metrics file) and
from the operating system (are its processes alive, how much memory they hold); never by asking the run.

`Follower` reads only what a metrics file gained since the last look, so a refresh costs the same at step 10 and at
step 10,000. The worker processes' liveness and memory come from psutil when the run is on this host, else from
Ray's state API when the run's cluster is reachable (imported only then).
"""

from __future__ import annotations

import json
import logging
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlkit.phases import PHASES
from rlkit.runs.read import METRICS_FILE, log_dir_of, run_state
from rlkit.runs.status import read_status

log = logging.getLogger("rlkit.runs")

#: the driver's step phase -> the roles working in it (the others wait), as rlkit/phases.py declares them
PHASE_ROLES = {name: phase.busy for name, phase in PHASES.items() if phase.busy}


class Follower:
    """The rows of a jsonl file, read incrementally (a file that shrank, e.g. rewound on resume, is read again)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.rows: list[dict[str, Any]] = []
        self._offset = 0
        self._partial = b""

    def poll(self) -> bool:
        """Read what was appended; True if rows were added."""
        try:
            size = self.path.stat().st_size
        except OSError:
            return False
        if size < self._offset:
            self.rows, self._offset, self._partial = [], 0, b""
        if size == self._offset:
            return False
        with open(self.path, "rb") as f:
            f.seek(self._offset)
            data = self._partial + f.read(size - self._offset)
        self._offset = size
        *lines, self._partial = data.split(b"\n")
        before = len(self.rows)
        for line in lines:
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict):
                self.rows.append(row)
        return len(self.rows) > before


@dataclass
class WorkerView:
    name: str  # group:rank
    roles: str
    pid: int
    phase: str
    alive: bool | None  # None: unknown (another host, no cluster to ask)
    rss_gb: float | None
    gpu_gb: float | None


@dataclass
class Snapshot:
    state: str
    phase: str
    step: int
    total: int | None
    trainer: str
    elapsed_s: float | None
    eta_s: float | None
    step_s: float | None
    reward: list[tuple[float, float]] = field(default_factory=list)
    val: list[tuple[float, float]] = field(default_factory=list)
    workers: list[WorkerView] = field(default_factory=list)
    driver_alive: bool | None = None
    updated_at: float | None = None
    error: str | None = None


def process_memory(pid: int) -> tuple[bool, float | None]:
    """(alive, RSS in GB) of a process on this host."""
    import psutil

    try:
        return True, psutil.Process(pid).memory_info().rss / 2**30
    except psutil.NoSuchProcess:
        return False, None
    except psutil.Error:
        return True, None


def ray_actor_states(address: str | None) -> dict[int, str]:
    """pid -> Ray's state of each actor (ALIVE, DEAD, ...) from the state API; {} when the cluster is unreachable."""
    if not address:
        return {}
    try:
        from ray.util.state import list_actors

        return {int(a.pid): a.state for a in list_actors(address=address, timeout=2, raise_on_missing_output=False)
                if getattr(a, "pid", None)}
    except Exception as exc:  # no dashboard, wrong address, a version skew: the status file is all there is
        log.debug("Ray state API unreachable at %s: %s", address, exc)
        return {}


class LiveRun:
    """One run as `rlkit top` follows it: `snapshot()` re-reads what changed."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.status = read_status(self.folder) or {}
        self.follower = Follower(log_dir_of(self.folder, self.status) / METRICS_FILE)
        self._ray_tried = 0.0
        self._ray_states: dict[int, str] = {}

    def _workers(self, status: dict[str, Any], phase: str, gpu_gb: float | None) -> list[WorkerView]:
        here = status.get("host") == socket.gethostname()
        if not here and time.monotonic() - self._ray_tried > 10:  # at most every 10 s: a slow API never stalls top
            self._ray_tried = time.monotonic()
            self._ray_states = ray_actor_states(status.get("ray_address"))
        active = PHASE_ROLES.get(phase, ())
        views = []
        for w in status.get("workers") or []:
            pid = int(w.get("pid", 0))
            if here:
                alive, rss = process_memory(pid)
            else:
                state = self._ray_states.get(pid)
                alive, rss = (None if state is None else state == "ALIVE"), None
            roles = list(w.get("roles") or [])
            busy = status.get("state") == "running" and any(r in active for r in roles)
            views.append(WorkerView(f"{w.get('group', '?')}:{w.get('rank', 0)}", "+".join(roles), pid,
                                    phase if busy else "idle", alive, rss, gpu_gb))
        return views

    def snapshot(self) -> Snapshot:
        self.status = read_status(self.folder) or self.status
        status = self.status
        self.follower.poll()
        rows = self.follower.rows
        state = run_state(status or None, rows)
        phase = str(status.get("phase", "?")) if state == "running" else state
        steps = [r for r in rows if "timing_s/step" in r]
        step_s = sum(r["timing_s/step"] for r in steps[-10:]) / len(steps[-10:]) if steps else None
        done = int(status.get("step") or (steps[-1]["step"] if steps else 0))
        total = status.get("total")
        eta = step_s * max(0, int(total) - done) if (step_s and total and state == "running") else None
        started = status.get("started_at")
        elapsed = None
        if started:
            elapsed = (time.time() if state == "running" else float(status.get("updated_at") or time.time())) - started
        reward = [(float(r["step"]), float(r["critic/score/mean"])) for r in rows
                  if isinstance(r.get("critic/score/mean"), (int, float))]
        if not reward:  # SFT / DPO: the training loss
            reward = [(float(r["step"]), float(r["train/loss"])) for r in rows
                      if isinstance(r.get("train/loss"), (int, float))]
        val = [(float(r["step"]), float(v)) for r in rows for k, v in r.items()
               if k.startswith("val/") and ("score/mean" in k or k == "val/loss") and isinstance(v, (int, float))]
        gpu = [v for r in rows[-1:] for k, v in r.items() if k.startswith("memory/") and "cuda" in k
               and isinstance(v, (int, float))]
        driver_alive = None
        if status.get("host") == socket.gethostname() and status.get("pid"):
            driver_alive = process_memory(int(status["pid"]))[0]
        return Snapshot(
            state=state, phase=phase, step=done, total=total, trainer=str(status.get("trainer", "?")),
            elapsed_s=elapsed, eta_s=eta, step_s=step_s, reward=reward, val=val,
            workers=self._workers(status, phase, max(gpu) if gpu else None), driver_alive=driver_alive,
            updated_at=status.get("updated_at"), error=status.get("error"),
        )
