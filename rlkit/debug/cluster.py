"""Start, find and stop the local Ray head that `rlkit cluster` manages.

A long-lived head (instead of the throwaway cluster `ray.init()` starts) is what the
VS Code extension points at: its dashboard address stays the same between runs.
We remember it in a small JSON file so `status`, `down` and `debug list` find it,
and we stop only *our* processes (found by the cluster's private temp dir), never
`ray stop`, which would take down every Ray cluster on a shared machine.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rlkit.errors import UserError

STATE_ENV = "RLKIT_CLUSTER_STATE"
DEFAULT_PORT = 6379
DEFAULT_DASHBOARD_PORT = 8265
# The VS Code extension sends no token, so token auth (on by default for new clusters in Ray 2.60) must be off.
AUTH_ENV = {"RAY_AUTH_MODE": "disabled"}


@dataclass
class ClusterInfo:
    address: str  # GCS "ip:port", what `ray.init(address=...)` / `rlkit train --address` take
    dashboard_url: str  # "http://127.0.0.1:8265", what the VS Code extension and `rlkit debug` use
    temp_dir: str  # private Ray temp dir: every process of this cluster has it in its command line
    node_ip: str = ""
    started_by: str = "rlkit cluster up"
    started_at: float = field(default_factory=time.time)
    num_cpus: float | None = None
    num_gpus: float | None = None
    driver_pid: int = 0  # for a cluster `rlkit train` started itself: it lives as long as that process


# -- the state file ----------------------------------------------------------------------------
def state_path() -> Path:
    if os.environ.get(STATE_ENV):
        return Path(os.environ[STATE_ENV])
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "rlkit" / "cluster.json"


def load_state() -> ClusterInfo | None:
    path = state_path()
    try:
        data = json.loads(path.read_text())
        return ClusterInfo(**data)
    except FileNotFoundError:
        return None
    except (ValueError, TypeError) as exc:
        raise UserError(f"{path}: unreadable cluster state ({exc}); delete the file and retry") from None


def save_state(info: ClusterInfo) -> None:
    path = state_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(info), indent=2))
    tmp.replace(path)


def clear_state() -> None:
    state_path().unlink(missing_ok=True)


def record_driver_cluster(dashboard_url: str | None, address: str, temp_dir: str = "") -> None:
    """For the trainer: remember a cluster that `ray.init()` started, so `rlkit debug list` finds it."""
    if not dashboard_url:
        return
    url = dashboard_url if "://" in dashboard_url else f"http://{dashboard_url}"
    try:
        known = load_state()
    except UserError:
        known = None
    if known is not None and known.dashboard_url.rstrip("/") == url.rstrip("/") and dashboard_alive(url):
        return  # a run joined (--address) the cluster `rlkit cluster up` started: keep that record
    save_state(
        ClusterInfo(
            address=address, dashboard_url=url, temp_dir=temp_dir, started_by="rlkit train", driver_pid=os.getpid()
        )
    )


# -- probes ------------------------------------------------------------------------------------
def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host if host != "0.0.0.0" else "", port))
        except OSError:
            return True
    return False


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def dashboard_alive(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/api/version", timeout=timeout) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def running_cluster() -> ClusterInfo | None:
    """The remembered cluster if it is up; a stale record is forgotten."""
    info = load_state()
    if info is None:
        return None
    if dashboard_alive(info.dashboard_url):
        return info
    if info.started_by == "rlkit cluster up" and cluster_processes(info.temp_dir):
        return info  # half alive (dashboard died): keep it so `rlkit cluster down` can clean up
    if info.driver_pid and _pid_alive(info.driver_pid):
        return info  # the run that owns it is still going (its dashboard is slow or still starting)
    clear_state()
    return None


def _pid_alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


# -- start / stop ------------------------------------------------------------------------------
def default_temp_dir(port: int) -> str:
    # Short on purpose: Ray puts Unix sockets under it (~107-byte path limit).
    return os.path.join(tempfile.gettempdir(), f"rlkit-ray-{port}")


def start_cluster(
    num_cpus: float | None = None,
    num_gpus: float | None = None,
    port: int = DEFAULT_PORT,
    dashboard_port: int = DEFAULT_DASHBOARD_PORT,
    dashboard_host: str = "127.0.0.1",
    temp_dir: str | None = None,
    timeout: float = 90.0,
) -> ClusterInfo:
    """`ray start --head` with the dashboard, token auth off, and all side ports picked free."""
    existing = running_cluster()
    if existing is not None:
        raise UserError(
            f"a Ray cluster started by {existing.started_by} is already running (dashboard {existing.dashboard_url});"
            " stop it with `rlkit cluster down` or use it as is"
        )
    for what, p, flag in (("GCS", port, "--port"), ("dashboard", dashboard_port, "--dashboard-port")):
        if port_in_use(p):
            raise UserError(f"{what} port {p} is already in use (another Ray cluster?); pick a free one with {flag}")
    temp_dir = os.path.abspath(temp_dir or default_temp_dir(port))
    if cluster_processes(temp_dir):
        raise UserError(f"Ray processes already use temp dir {temp_dir}; stop them or pass another --temp-dir")
    cmd = [
        sys.executable, "-m", "ray.scripts.scripts", "start", "--head",
        f"--port={port}", "--include-dashboard=true",
        f"--dashboard-host={dashboard_host}", f"--dashboard-port={dashboard_port}",
        f"--temp-dir={temp_dir}", "--disable-usage-stats",
        # Side ports default to fixed numbers that clash with other clusters on a shared machine.
        f"--dashboard-agent-listen-port={free_port()}", f"--dashboard-agent-grpc-port={free_port()}",
        f"--runtime-env-agent-port={free_port()}", f"--ray-client-server-port={free_port()}",
        f"--metrics-export-port={free_port()}", f"--node-manager-port={free_port()}",
        f"--object-manager-port={free_port()}",
    ]  # fmt: skip
    if num_cpus is not None:
        cmd.append(f"--num-cpus={num_cpus:g}")
    if num_gpus is not None:
        cmd.append(f"--num-gpus={num_gpus:g}")
    env = {**os.environ, **AUTH_ENV}
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_processes(temp_dir)
        logs = f"{temp_dir}/session_latest/logs"
        raise UserError(f"`ray start` did not finish within {timeout:.0f}s; see {logs}") from None
    if proc.returncode != 0:
        stop_processes(temp_dir)
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-8:])
        raise UserError(f"`ray start` failed (exit {proc.returncode}):\n{tail}")
    host = "127.0.0.1" if dashboard_host in ("127.0.0.1", "localhost", "0.0.0.0", "") else dashboard_host
    url = f"http://{host}:{dashboard_port}"
    _wait_dashboard(url, timeout, temp_dir)
    node_ip = _head_ip(url)
    info = ClusterInfo(
        address=f"{node_ip}:{port}", dashboard_url=url, temp_dir=temp_dir, node_ip=node_ip,
        num_cpus=num_cpus, num_gpus=num_gpus,
    )  # fmt: skip
    save_state(info)
    return info


def _wait_dashboard(url: str, timeout: float, temp_dir: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if dashboard_alive(url):
            return
        time.sleep(0.5)
    stop_processes(temp_dir)
    logs = f"{temp_dir}/session_latest/logs"
    raise UserError(f"the Ray head started but its dashboard at {url} never answered; see {logs}")


def _head_ip(url: str) -> str:
    from rlkit.debug.state import Dashboard  # local import: state imports nothing from here

    try:
        for node in Dashboard(url).list("nodes"):
            if node.get("is_head_node"):
                return str(node.get("node_ip"))
    except UserError:
        pass
    from ray.util import get_node_ip_address

    return get_node_ip_address()


def cluster_processes(temp_dir: str) -> list:
    """Processes of the cluster using `temp_dir`: those naming it on their command line, plus descendants."""
    import psutil

    if not temp_dir:
        return []
    temp_dir = os.path.abspath(temp_dir)
    roots = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        args = proc.info.get("cmdline") or []
        if proc.pid != os.getpid() and any(_names_dir(a, temp_dir) for a in args):
            roots.append(proc)
    found = {p.pid: p for p in roots}
    for proc in roots:
        try:
            found.update({c.pid: c for c in proc.children(recursive=True)})
        except psutil.Error:
            pass
    return list(found.values())


def _names_dir(arg: str, temp_dir: str) -> bool:
    return f"{temp_dir}/" in arg or arg.endswith(f"={temp_dir}") or arg == temp_dir


def stop_processes(temp_dir: str, timeout: float = 5.0) -> int:
    """SIGTERM, then SIGKILL after `timeout` s, every process of the cluster in `temp_dir`; returns the count.

    raylet and gcs_server drain for 10-15 s on SIGTERM; a local dev head has nothing worth that wait.
    """
    import psutil

    procs = cluster_processes(temp_dir)
    for proc in procs:
        try:
            proc.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=5)
    return len(procs)


def stop_cluster(timeout: float = 5.0) -> ClusterInfo:
    """Stop the cluster `rlkit cluster up` started (UserError when there is none)."""
    info = load_state()
    if info is None:
        raise UserError("no cluster started by `rlkit cluster up` is running; start one with `rlkit cluster up`")
    if info.started_by != "rlkit cluster up":
        clear_state()
        raise UserError(f"the remembered cluster was started by {info.started_by}; it stops when that run ends")
    count = stop_processes(info.temp_dir, timeout=timeout)
    clear_state()
    if count == 0:
        raise UserError(f"the cluster at {info.dashboard_url} was not running any more (forgot it)")
    return info


def resolve_dashboard(explicit: str | None = None) -> str:
    """The dashboard to talk to: --dashboard, then $RLKIT_DASHBOARD, then the remembered cluster, then :8265."""
    for candidate in (explicit, os.environ.get("RLKIT_DASHBOARD")):
        if candidate:
            return candidate if "://" in candidate else f"http://{candidate}"
    info = running_cluster()
    if info is not None:
        return info.dashboard_url
    default = f"http://127.0.0.1:{DEFAULT_DASHBOARD_PORT}"
    if dashboard_alive(default):
        return default
    raise UserError(
        "no Ray cluster is running that rlkit knows of; start one with `rlkit cluster up`"
        " (or pass --dashboard http://HOST:PORT)"
    )
