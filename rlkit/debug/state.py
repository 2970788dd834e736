"""Read the cluster through the Ray dashboard's HTTP API: nodes, jobs, resources, paused workers.

Paused workers are found exactly the way the VS Code extension finds them:
`GET /api/v0/workers?detail=1` filtered on `num_paused_threads != 0` and
`is_alive = True`; each record carries the node IP and the debugpy port. We add
who the worker is (actor name/class, running task, rank) from the actor and task
tables, so `rlkit debug list` can say "rank 1 of actor_rollout, in update_policy".
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from rlkit.errors import UserError

Filter = tuple[str, str, str]
_RANK_RE = re.compile(r"rank[\s_=:-]*(\d+)", re.IGNORECASE)
_NAME_RANK_RE = re.compile(r":(\d+)$")  # worker-group actors are named "<group>:<rank>" (rlkit.controller)


class Dashboard:
    """A thin client for the dashboard endpoints we need. A loopback cluster needs no token (auth off); one on the
    network (token auth) needs its token in every request (`token`; `token_source` names where it came from)."""

    def __init__(self, url: str, timeout: float = 10.0, token: str | None = None, token_source: str = "") -> None:
        self.url = (url if "://" in url else f"http://{url}").rstrip("/")
        self.timeout = timeout
        self.token = token
        self.token_source = token_source

    def get(self, path: str, params: list[tuple[str, Any]] | None = None) -> Any:
        query = urllib.parse.urlencode(params or [])
        url = f"{self.url}{path}" + (f"?{query}" if query else "")
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=self.timeout) as resp:
                payload = json.loads(resp.read().decode("utf-8"))
        except urllib.error.HTTPError as exc:
            if exc.code in (401, 403):
                raise UserError(self._refused(exc.code)) from None
            detail = exc.read().decode("utf-8", "replace")[:300]
            raise UserError(f"the Ray dashboard at {self.url} answered {exc.code} to {path}: {detail}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise UserError(
                f"cannot reach the Ray dashboard at {self.url} ({getattr(exc, 'reason', exc)}); is the cluster up?"
                " (`rlkit cluster status`, or pass --dashboard)"
            ) from None
        if isinstance(payload, dict) and payload.get("result") is False:
            raise UserError(f"the Ray dashboard refused {path}: {payload.get('msg')}")
        return payload.get("data", payload) if isinstance(payload, dict) else payload

    def _refused(self, code: int) -> str:
        fix = ("pass --token-file FILE (a copy of the head's token file, printed by `rlkit cluster up`)"
               " or set RAY_AUTH_TOKEN_PATH")  # fmt: skip
        if code == 401 or not self.token:
            return f"the Ray dashboard at {self.url} needs the cluster's token (token auth is on); {fix}"
        return f"the Ray dashboard at {self.url} rejected the token from {self.token_source or 'the caller'}; {fix}"

    def list(self, resource: str, filters: list[Filter] | None = None, detail: bool = True) -> list[dict]:
        """State API list (`/api/v0/<resource>`); filters are (key, "=" or "!=", value)."""
        params: list[tuple[str, Any]] = [("detail", "1" if detail else "0"), ("limit", 10000)]
        for key, pred, value in filters or []:
            params += [("filter_keys", key), ("filter_predicates", pred), ("filter_values", value)]
        data = self.get(f"/api/v0/{resource}", params)
        return list(data.get("result", {}).get("result", []))

    def resource_usage(self) -> dict[str, tuple[float, float]]:
        """Cluster-wide {resource: (used, total)} from the autoscaler report."""
        data = self.get("/api/cluster_status")
        usage = ((data.get("clusterStatus") or {}).get("loadMetricsReport") or {}).get("usage") or {}
        return {k: (float(v[0]), float(v[1])) for k, v in usage.items() if not k.startswith("node:")}


@dataclass
class PausedWorker:
    worker_id: str
    pid: int
    ip: str
    port: int
    node_id: str = ""
    paused_threads: int = 1
    actor_name: str = ""
    actor_class: str = ""
    actor_id: str = ""
    task: str = ""  # the running task/method, e.g. "ActorWorker.update_policy"
    job_id: str = ""
    rank: int | None = None
    where: str = ""  # file:line in the user's code, when we could look (local py-spy)

    @property
    def role(self) -> str:
        return self.actor_name or self.actor_class or self.task.split(".")[0] or "task"

    def short_id(self) -> str:
        return self.worker_id[:8]


def paused_workers(dashboard: Dashboard) -> list[PausedWorker]:
    """Live workers paused in the debugger, by rank then pid (a stable order for `attach N`)."""
    rows = dashboard.list(
        "workers",
        [("num_paused_threads", "!=", "0"), ("is_alive", "=", "True")],
    )
    out = [_describe(dashboard, row) for row in rows if row.get("debugger_port") and row.get("num_paused_threads")]
    out.sort(key=lambda w: (w.rank if w.rank is not None else 1 << 30, w.pid))
    return out


def _describe(dashboard: Dashboard, row: dict) -> PausedWorker:
    """Who the worker is: its actor (matched by pid on its node) and the task it is running."""
    pid, node = str(row.get("pid", "")), str(row.get("node_id", ""))
    actors = dashboard.list("actors", [("pid", "=", pid), ("node_id", "=", node), ("state", "=", "ALIVE")])
    tasks = dashboard.list("tasks", [("worker_id", "=", str(row.get("worker_id"))), ("state", "=", "RUNNING")])
    actor = actors[0] if actors else {}
    task = tasks[0] if tasks else {}
    return PausedWorker(
        worker_id=str(row.get("worker_id", "")),
        pid=int(row.get("pid", 0)),
        ip=str(row.get("ip", "")),
        port=int(row["debugger_port"]),
        node_id=node,
        paused_threads=int(row.get("num_paused_threads") or 1),
        actor_name=str(actor.get("name") or ""),
        actor_class=str(actor.get("class_name") or ""),
        actor_id=str(actor.get("actor_id") or ""),
        task=str(task.get("func_or_class_name") or task.get("name") or ""),
        job_id=str(task.get("job_id") or actor.get("job_id") or ""),
        rank=_rank_of(actor, task),
    )


def _rank_of(actor: dict, task: dict) -> int | None:
    """Rank from the actor's name / repr ("...rank1", "rank=1", "group:1") or a RANK env var in its runtime_env."""
    for text in (actor.get("name"), actor.get("repr_name")):
        match = _RANK_RE.search(text or "")
        if match:
            return int(match.group(1))
    match = _NAME_RANK_RE.search(str(actor.get("name") or ""))
    if match:
        return int(match.group(1))
    for serialized in (
        actor.get("serialized_runtime_env"),
        ((task.get("runtime_env_info") or {}).get("serialized_runtime_env")),
    ):
        try:
            rank = json.loads(serialized or "{}").get("env_vars", {}).get("RANK")
        except (ValueError, AttributeError):
            continue
        if rank is not None and str(rank).isdigit():
            return int(rank)
    return None


def pick_worker(workers: list[PausedWorker], selector: str | None) -> PausedWorker:
    """WORKER = index in the list, pid, `rank<N>`, or a worker-id prefix; none needed when only one is paused."""
    if not workers:
        raise UserError("no paused workers: nothing hit a breakpoint() yet (is the run started with --debug?)")
    if selector is None:
        if len(workers) == 1:
            return workers[0]
        raise UserError(f"{len(workers)} workers are paused; pick one: `rlkit debug attach 0` (see `rlkit debug list`)")
    sel = selector.strip()
    if sel.isdigit():
        n = int(sel)
        if n < len(workers):
            return workers[n]
        by_pid = [w for w in workers if w.pid == n]
        if by_pid:
            return by_pid[0]
    match = re.fullmatch(r"rank[=:]?(\d+)", sel, re.IGNORECASE)
    if match:
        by_rank = [w for w in workers if w.rank == int(match.group(1))]
        if len(by_rank) == 1:
            return by_rank[0]
    by_id = [w for w in workers if w.worker_id.startswith(sel.lower())]
    if len(by_id) == 1:
        return by_id[0]
    known = ", ".join(f"{i} (pid {w.pid})" for i, w in enumerate(workers))
    raise UserError(f"no single paused worker matches '{selector}'; use an index, pid, rankN or id prefix: {known}")


# Frames that belong to the pause machinery, not to the code that paused.
_MACHINERY = (
    "debugpy/", "pydevd", "threading.py", "ray/util/", "ray/_private/", "_raylet.pyx", "default_worker.py",
    "rlkit/debug/",
)  # fmt: skip
_FRAME_RE = re.compile(r"^\s+(?P<func>.+?) \((?P<loc>[^()]+:\d+)\)\s*$")


def local_ips() -> set[str]:
    import psutil

    ips = {"127.0.0.1", "localhost"}
    for addrs in psutil.net_if_addrs().values():
        ips.update(a.address for a in addrs if a.family.name in ("AF_INET", "AF_INET6"))
    return ips


def peek_where(worker: PausedWorker, timeout: float = 5.0) -> str:
    """Where a paused worker on *this* node stopped ("func (file:line)"), read with py-spy without attaching.

    Attaching to peek would release the breakpoint on detach, so we never do that here.
    Returns "" when py-spy is missing, the worker is remote, or the stack is not readable.
    """
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if worker.ip not in local_ips() or not Path(exe).exists():
        return ""
    try:
        out = subprocess.run([exe, "dump", "--pid", str(worker.pid)], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return where_from_dump(out.stdout)


def where_from_dump(dump: str) -> str:
    """From `py-spy dump` text: the first frame below the pause machinery of the thread waiting for a client."""
    for block in dump.split("\nThread ")[1:]:
        if "wait_for_client" not in block and "_wait_for_attach" not in block:
            continue
        if "_post_mortem" in block:
            return "uncaught exception (post-mortem)"
        frames = [m for m in map(_FRAME_RE.match, block.splitlines()[1:]) if m]
        for frame in frames:
            if not any(tag in frame.group("loc") or tag in frame.group("func") for tag in _MACHINERY):
                return f"{frame.group('func')} ({frame.group('loc')})"
    return ""
