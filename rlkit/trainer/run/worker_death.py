"""A worker process that died (SIGKILL, the OOM killer, a segfault): which one, why, and its last log lines.

The driver only learns of a death through a failed call (Ray's `ActorDiedError`, or a peer's collective that
lost its partner). `find_death` asks every worker of the run for its pid: the one Ray reports dead is named by
group, rank and roles, with Ray's exit type, the signal when the worker's own log shows one (Python's
faulthandler writes "Fatal Python error: Segmentation fault"), and the last lines it logged. SIGKILL and the
OOM killer leave no line in the worker: Ray then says the process ended without its shutdown.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

NODE_GRACE_S = 30.0  # Ray's health checks mark a lost node dead within ~15-30 s (period 3 s x 5 misses + timeout)
PING_S = 2.0  # a dead worker's ping fails at once; a live one answers, or is busy (alive) and is not waited for
LOG_LINES = 5
EXIT_TYPE = re.compile(r"Worker exit type: (\S+)")
FATAL = re.compile(r"Fatal Python error: (.+)")
NOISE = re.compile(r"it/s\]|s/it\]|\[repeated \d+x")  # progress-bar redraws and Ray's repeat counters


@dataclass
class WorkerDeath:
    group: str
    rank: int
    roles: list[str]
    pid: int | None
    cause: str
    last_lines: list[str] = field(default_factory=list)
    node: str = ""  # "IP (node id)" on a cluster of several nodes

    def line(self, step: int) -> str:
        """One line for the console: who died during which step, on which node, why, what it said last."""
        where = f"; node {self.node}" if self.node else ""
        who = f"worker {self.group}:{self.rank} ({', '.join(self.roles)}; pid {self.pid}{where})"
        tail = f"; its last log lines: {' | '.join(self.last_lines)}" if self.last_lines else ""
        return f"{who} died during step {step}: {self.cause}{tail}"


def find_death(workers: Any, exc: BaseException) -> WorkerDeath | None:
    """The dead worker behind `exc` (a failed worker call), or None when every worker is alive (a plain error)."""
    import ray

    from rlkit.controller import WorkerError

    if not isinstance(exc, WorkerError | ray.exceptions.RayActorError):
        return None
    pings = {actor.pid.remote(): (group, rank) for group in workers.groups for rank, actor in enumerate(group.actors)}
    ready, _ = ray.wait(list(pings), num_returns=len(pings), timeout=PING_S)  # the busy ones are alive: not waited on
    for ref in ready:
        try:
            ray.get(ref)
        except ray.exceptions.RayActorError as dead:
            group, rank = pings[ref]
            pid = group.pids[rank] if rank < len(group.pids) else None
            node = (getattr(group, "nodes", None) or [{}] * (rank + 1))[rank] if rank < len(group.pids) else {}
            lost = node_lost(node.get("node_id"))
            lines = [] if lost else log_tail(pid)
            why = lost or cause(str(dead), lines)
            return WorkerDeath(group.name_prefix, rank, [r or "worker" for r in group.roles], pid, why,
                               lines[-LOG_LINES:], _node_name(node) if len(_nodes()) > 1 else "")
    return None


def _nodes() -> list[dict[str, Any]]:
    import ray

    return ray.nodes()


def _node_name(node: dict[str, str]) -> str:
    return f"{node.get('ip', '?')} ({str(node.get('node_id', ''))[:8]})" if node else ""


def node_lost(node_id: str | None, wait_s: float = NODE_GRACE_S) -> str:
    """'its node ... left the cluster' when Ray marks the worker's node dead (its raylet killed, the machine lost),
    else ''. On a cluster of several nodes Ray notices a lost node only at its health checks, seconds after the
    worker's calls fail: waited for up to `wait_s`."""
    if not node_id:
        return ""
    deadline = time.monotonic() + (wait_s if len(_nodes()) > 1 else 0.0)
    while True:
        node = next((n for n in _nodes() if n["NodeID"] == node_id), None)
        if node is not None and not node.get("Alive"):
            return (f"its node {node.get('NodeManagerAddress', '?')} ({node_id[:8]}) left the cluster (the node's "
                    "raylet stopped: the machine, its network or `ray stop` there)")
        if time.monotonic() >= deadline:
            return ""
        time.sleep(1.0)


def cause(ray_message: str, lines: list[str]) -> str:
    """Why it died, as far as anyone knows: the fatal signal the worker printed, else Ray's exit type."""
    for line in reversed(lines):
        m = FATAL.search(line)
        if m:
            return m.group(1).strip()
    m = EXIT_TYPE.search(ray_message)
    kind = m.group(1) if m else "unknown"
    if kind == "SYSTEM_ERROR":
        return ("the process ended without a word (exit type SYSTEM_ERROR: a signal such as SIGKILL or "
                "SIGSEGV, or the kernel's OOM killer; `dmesg` shows an OOM kill)")
    return f"exit type {kind}"


def log_tail(pid: int | None, lines: int = 40) -> list[str]:
    """The last lines of a Ray worker's stdout and stderr logs (this node's session), [] if not found."""
    if pid is None:
        return []
    try:
        import ray._private.worker as ray_worker  # the session's log folder has no public accessor in Ray 2.x

        logs = Path(ray_worker._global_node.get_logs_dir_path())
    except Exception:
        return []
    out: list[str] = []
    for path in sorted(logs.glob(f"worker-*-{pid}.out")) + sorted(logs.glob(f"worker-*-{pid}.err")):
        try:
            text = path.read_text(errors="replace").splitlines()
        except OSError:
            continue
        out += [ln.strip() for ln in text if ln.strip() and not ln.startswith(":") and not NOISE.search(ln)]
    return out[-lines:]
