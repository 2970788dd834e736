"""Start, find, join and stop the local Ray head that `rlkit cluster` manages.

A long-lived head (instead of the throwaway cluster `ray.init()` starts) is what the VS Code
extension points at: its dashboard address stays the same between runs. Three kinds of record:

- `cluster.json`: the head `rlkit cluster up` started. `rlkit train`/`rlkit eval` join it when
  it is up, `rlkit cluster down` stops it; nothing else writes this file.
- `cluster.runs/<pid>.json`: the private Ray a `--debug` run started for itself (no cluster up, or
  `--address local`), so `rlkit debug list` finds its dashboard. Gone when the run ends.
- `cluster.join.json`: the worker node `rlkit cluster join` started here (rlkit.controller.cluster_join).

A cluster on the network runs with Ray's token auth (the token file, `cluster_token` beside the
records, is made 0600 on first use: rlkit.utils.ray_token); a loopback one keeps it off, because the
VS Code extension sends no token and only this machine can connect.

We stop only *our* processes (see rlkit.controller.processes), never `ray stop`.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from rlkit.controller.processes import cluster_processes, free_ports, pid_alive, port_in_use, stop_processes
from rlkit.debug.listeners import LOOPBACK_ENV, LOOPBACK_IP, SINGLE_NODE_ENV, Listener, is_loopback, listeners
from rlkit.errors import UserError
from rlkit.utils import ray_token

if TYPE_CHECKING:
    from rlkit.debug.state import Dashboard

STATE_ENV = "RLKIT_CLUSTER_STATE"
DEFAULT_PORT = 6379
DEFAULT_DASHBOARD_PORT = 8265
UP = "rlkit cluster up"
PRIVATE = "local"  # `--address local`: a private Ray for this run (Ray's own name for it)
# A loopback cluster: the VS Code extension sends no token, so token auth (on by default for new clusters in
# Ray 2.60) is off. A cluster on the network uses ray_token.token_env(its token file) instead.
AUTH_ENV = {ray_token.MODE_ENV: "disabled"}
# Ray starts its worker processes at nice 15 (its `worker_niceness`), so on a machine shared with anything at nice
# 0 (a tokenizer, a data loader, another user's job) every trainer and engine process of rlkit yields its cores;
# measured here with light background load: an SFT step 5.46 s at nice 15, 4.87 s at nice 0. rlkit's clusters run
# their workers at the user's own priority; RAY_worker_niceness set by the user wins.
WORKER_ENV = {"RAY_worker_niceness": "0"}

# torch's CPU allocator on transparent huge pages for tensors of >= 2 MB (the kernel's THP mode is usually
# `madvise`: nothing else asks for them). A training step allocates and frees gigabytes of activations, each fresh
# 4 KB page a fault the kernel zeroes. Measured on SmolLM2-135M, one bf16 SFT step of 1738 tokens in a process:
# system time 7.8-8.3 -> 5.2-5.6 s, the step 3.6-4.1 -> 3.2-3.7 s; the SFT bench 1.06x -> 1.23x TRL. Only where no
# vLLM engine shares the workers: a GRPO step's generation measured 6.0 -> 7.7 s with it (docs/performance.md).
HUGE_PAGES_ENV = {"THP_MEM_ALLOC_ENABLE": "1"}


def with_worker_env(env: dict[str, str]) -> dict[str, str]:
    """`env` with WORKER_ENV's entries the user did not set (the raylet passes its environment to the workers)."""
    return {**WORKER_ENV, **env}


def huge_pages_env(engine_in_workers: bool) -> dict[str, str]:
    """HUGE_PAGES_ENV for a run's workers (its runtime_env): trainer-only runs (SFT, DPO), unless the user set it."""
    if engine_in_workers or any(k in os.environ for k in HUGE_PAGES_ENV):
        return {}
    return dict(HUGE_PAGES_ENV)


@dataclass
class ClusterInfo:
    address: str  # GCS "ip:port", what `ray.init(address=...)` takes
    dashboard_url: str  # "http://127.0.0.1:8265", what the VS Code extension and `rlkit debug` use
    temp_dir: str  # private Ray temp dir: every process of this cluster has it in its command line
    node_ip: str = ""
    started_by: str = UP
    started_at: float = field(default_factory=time.time)
    num_cpus: float | None = None
    num_gpus: float | None = None
    driver_pid: int = 0  # a run's private cluster: it lives as long as that process
    loopback: bool = True  # every service on 127.0.0.1 (single node); False: on the network
    own_temp_dir: bool = False  # `rlkit cluster down` removes the temp dir (we made it)
    token_file: str = ""  # token auth on (the cluster is on the network): the file with its token; "": auth off

    @property
    def gcs_port(self) -> int | None:
        port = self.address.rsplit(":", 1)[-1]
        return int(port) if port.isdigit() else None


# -- the records -------------------------------------------------------------------------------
def state_path() -> Path:
    """The record of `rlkit cluster up` ($RLKIT_CLUSTER_STATE, else ~/.cache/rlkit/cluster.json)."""
    if os.environ.get(STATE_ENV):
        return Path(os.environ[STATE_ENV])
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "rlkit" / "cluster.json"


def default_token_file() -> Path:
    """Where `rlkit cluster up --listen-all` keeps the token it made (beside the records; not Ray's ~/.ray)."""
    return state_path().with_name("cluster_token")


def runs_dir() -> Path:
    """Records of private clusters, one per run, next to the `cluster up` record."""
    path = state_path()
    return path.with_name(f"{path.stem}.runs")


def read_record(path: Path) -> ClusterInfo | None:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: unreadable cluster state ({exc}); delete the file and retry") from None
    known = {f.name for f in dataclasses.fields(ClusterInfo)}
    try:
        return ClusterInfo(**{k: v for k, v in data.items() if k in known})
    except TypeError as exc:
        raise UserError(f"{path}: unreadable cluster state ({exc}); delete the file and retry") from None


def write_record(path: Path, info: ClusterInfo) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(asdict(info), indent=2))
    tmp.replace(path)


def load_state() -> ClusterInfo | None:
    return read_record(state_path())


def save_state(info: ClusterInfo) -> None:
    write_record(state_path(), info)


def clear_state() -> None:
    state_path().unlink(missing_ok=True)


def record_driver_cluster(dashboard_url: str | None, address: str, temp_dir: str = "") -> Path | None:
    """For a run on its private Ray: remember it (until this process exits) so `rlkit debug list` finds it."""
    if not dashboard_url:
        return None
    url = dashboard_url if "://" in dashboard_url else f"http://{dashboard_url}"
    path = runs_dir() / f"{os.getpid()}.json"
    info = ClusterInfo(address=address, dashboard_url=url, temp_dir=temp_dir, started_by="rlkit train",
                       driver_pid=os.getpid(), node_ip=address.rsplit(":", 1)[0])  # fmt: skip
    info.loopback = is_loopback(info.node_ip) if info.node_ip else True
    write_record(path, info)
    atexit.register(path.unlink, missing_ok=True)
    return path


def running_runs() -> list[ClusterInfo]:
    """Private clusters of runs still going, newest first; records of finished runs are removed."""
    found = []
    for path in sorted(runs_dir().glob("*.json")):
        try:
            info = read_record(path)
        except UserError:
            info = None
        if info is not None and info.driver_pid and pid_alive(info.driver_pid):
            found.append(info)
        else:
            path.unlink(missing_ok=True)
    return sorted(found, key=lambda i: i.started_at, reverse=True)


# -- probes ------------------------------------------------------------------------------------
def dashboard_alive(url: str, timeout: float = 2.0) -> bool:
    """The dashboard answers; under token auth it answers 401 without the token (it is up: it checked)."""
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/api/version", timeout=timeout) as resp:
            return resp.status == 200
    except urllib.error.HTTPError as exc:
        return exc.code in (401, 403)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def running_cluster() -> ClusterInfo | None:
    """The cluster `rlkit cluster up` started, if it is up; a stale record is forgotten."""
    info = load_state()
    if info is None:
        return None
    if info.started_by != UP:  # written by an older rlkit for a run's private cluster
        clear_state()
        return None
    if dashboard_alive(info.dashboard_url) or cluster_processes(info.temp_dir, info.gcs_port):
        return info  # half alive (dashboard died) is kept so `rlkit cluster down` can clean up
    clear_state()
    return None


def cluster_listeners(info: ClusterInfo) -> list[Listener]:
    """The listening sockets of the cluster's processes on this machine."""
    return listeners(cluster_processes(info.temp_dir, info.gcs_port))


# -- which cluster a run uses --------------------------------------------------------------------
@dataclass(frozen=True)
class Target:
    address: str  # PRIVATE, or a GCS address to join
    joined: ClusterInfo | None = None  # the `rlkit cluster up` record, when joining that cluster

    @property
    def private(self) -> bool:
        return self.address == PRIVATE

    @property
    def loopback(self) -> bool:
        """Private (one machine), or a cluster at 127.0.0.1: the driver must keep Ray in single-node mode,
        or Ray rewrites 127.0.0.1 to the network address, where a loopback cluster does not listen."""
        return self.private or is_loopback(self.address.rsplit(":", 1)[0])


def choose_cluster(explicit: str | None = None) -> Target:
    """--address, then $RAY_ADDRESS, then the cluster `rlkit cluster up` started (when up), else a private one."""
    address = explicit or os.environ.get("RAY_ADDRESS") or ""
    up = running_cluster()
    if address:
        return Target(address, up if up is not None and address == up.address else None)
    if up is None:
        return Target(PRIVATE)
    if not dashboard_alive(up.dashboard_url, timeout=5.0):
        raise UserError(
            f"the cluster from `rlkit cluster up` ({up.address}) does not answer at {up.dashboard_url}; "
            "restart it (`rlkit cluster down`, then `rlkit cluster up`) or pass --address local for a private one"
        )
    return Target(up.address, up)


# -- start / stop ------------------------------------------------------------------------------
def default_temp_dir(port: int) -> str:
    # Short on purpose: Ray puts Unix sockets under it (~107-byte path limit).
    return os.path.join(tempfile.gettempdir(), f"rlkit-ray-{port}")


def start_cluster(
    num_cpus: float | None = None,
    num_gpus: float | None = None,
    port: int = DEFAULT_PORT,
    dashboard_port: int = DEFAULT_DASHBOARD_PORT,
    dashboard_host: str = LOOPBACK_IP,
    temp_dir: str | None = None,
    timeout: float = 90.0,
    node_ip: str | None = None,
    listen_all: bool = False,
    token_file: str | None = None,
) -> ClusterInfo:
    """`ray start --head` with the dashboard, all side ports picked free.

    Default: one node, every service on 127.0.0.1 (rlkit.debug.listeners), token auth off. `node_ip`
    (or `listen_all`: Ray's own pick of the node IP) puts Ray on the network so other nodes can join,
    with token auth on: the token in `token_file` (default_token_file()), made 0600 if missing.
    """
    if node_ip and listen_all:
        raise UserError("pass either --node-ip or --listen-all, not both")
    loopback = not listen_all and (not node_ip or is_loopback(node_ip))
    if loopback and token_file:
        raise UserError("--token-file is for a cluster on the network (add --listen-all or --node-ip IP);"
                        " a loopback cluster runs without token auth")  # fmt: skip
    existing = running_cluster()
    if existing is not None:
        raise UserError(
            f"a Ray cluster started by {existing.started_by} is already running (dashboard {existing.dashboard_url});"
            " stop it with `rlkit cluster down` or use it as is"
        )
    for what, p, flag in (("GCS", port, "--port"), ("dashboard", dashboard_port, "--dashboard-port")):
        if port_in_use(p):
            raise UserError(f"{what} port {p} is already in use ({_holder(p)}); pick a free one with {flag}")
    own_temp_dir = temp_dir is None or not os.path.exists(temp_dir)
    temp_dir = os.path.abspath(temp_dir or default_temp_dir(port))
    if cluster_processes(temp_dir, port):
        raise UserError(f"Ray processes already use temp dir {temp_dir}; stop them or pass another --temp-dir")
    cmd = [
        sys.executable, "-m", "ray.scripts.scripts", "start", "--head",
        f"--port={port}", "--include-dashboard=true",
        f"--dashboard-host={dashboard_host}", f"--dashboard-port={dashboard_port}",
        f"--temp-dir={temp_dir}", "--disable-usage-stats", *side_port_args(avoid=(port, dashboard_port), client=True),
    ]  # fmt: skip
    env = with_worker_env({**os.environ, **AUTH_ENV})
    if loopback:
        cmd.append(f"--node-ip-address={LOOPBACK_IP}")
        env.update(LOOPBACK_ENV)
    else:
        token_file = str(Path(token_file or default_token_file()).expanduser().absolute())
        ray_token.create_or_read(token_file)
        env = ray_token.with_token(env, token_file)
        cmd += [f"--node-ip-address={node_ip}"] if node_ip else []
        env.pop(SINGLE_NODE_ENV, None)
    cmd += [f"--num-cpus={num_cpus:g}"] if num_cpus is not None else []
    cmd += [f"--num-gpus={num_gpus:g}"] if num_gpus is not None else []
    run_ray_start(cmd, env, timeout, temp_dir, port)
    host = LOOPBACK_IP if dashboard_host in (LOOPBACK_IP, "localhost", "0.0.0.0", "") else dashboard_host
    url = f"http://{host}:{dashboard_port}"
    _wait_dashboard(url, timeout, temp_dir, port)
    ip = _head_ip(url, token_file)
    info = ClusterInfo(
        address=f"{ip}:{port}", dashboard_url=url, temp_dir=temp_dir, node_ip=ip, num_cpus=num_cpus,
        num_gpus=num_gpus, loopback=loopback, own_temp_dir=own_temp_dir or temp_dir == default_temp_dir(port),
        token_file=token_file or "",
    )  # fmt: skip
    save_state(info)
    return info


def side_port_args(avoid: tuple[int, ...] = (), client: bool = False) -> list[str]:
    """Ray's side ports (and the head's client server port with `client`), picked free and distinct, none of
    `avoid` (the ports the command names itself): their defaults are fixed numbers that clash with other clusters
    on a shared machine (the head's and a joined node's alike)."""
    flags = ["--dashboard-agent-listen-port", "--dashboard-agent-grpc-port", "--runtime-env-agent-port",
             "--metrics-export-port", "--node-manager-port", "--object-manager-port"]
    flags += ["--ray-client-server-port"] if client else []
    return [f"{flag}={port}" for flag, port in zip(flags, free_ports(len(flags), avoid), strict=True)]


def _holder(port: int) -> str:
    runs = [r for r in running_runs() if r.dashboard_url.endswith(f":{port}")]
    if runs:
        return f"the private Ray of a `rlkit train` run, pid {runs[0].driver_pid}"
    return "another Ray cluster?"


def run_ray_start(cmd: list[str], env: dict, timeout: float, temp_dir: str, port: int | None) -> None:
    """Run `ray start`; on a failure stop what it left and raise the tail of its output."""
    logs = f"{temp_dir}/session_latest/logs"
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_processes(temp_dir, gcs_port=port)
        raise UserError(f"`ray start` did not finish within {timeout:.0f}s; see {logs}") from None
    if proc.returncode != 0:
        stop_processes(temp_dir, gcs_port=port)
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-8:])
        raise UserError(f"`ray start` failed (exit {proc.returncode}):\n{tail}")


def _wait_dashboard(url: str, timeout: float, temp_dir: str, port: int) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if dashboard_alive(url):
            return
        time.sleep(0.5)
    stop_processes(temp_dir, gcs_port=port)
    logs = f"{temp_dir}/session_latest/logs"
    raise UserError(f"the Ray head started but its dashboard at {url} never answered; see {logs}")


def _head_ip(url: str, token_file: str | None = None) -> str:
    from rlkit.debug.state import Dashboard  # local import: state imports nothing from here

    try:
        token = ray_token.read_token(token_file) if token_file else None
        for node in Dashboard(url, token=token).list("nodes"):
            if node.get("is_head_node"):
                return str(node.get("node_ip"))
    except UserError:
        pass
    from ray.util import get_node_ip_address

    return get_node_ip_address()


@dataclass
class Stopped:
    info: ClusterInfo
    processes: int  # 0: it had already stopped; we only forgot it


def stop_cluster(timeout: float = 5.0) -> Stopped | None:
    """Stop what `rlkit cluster up` started and remove its temp dir; None when nothing was recorded."""
    info = load_state()
    if info is None or info.started_by != UP:
        clear_state()
        return None
    count = stop_processes(info.temp_dir, timeout=timeout, gcs_port=info.gcs_port)
    if info.own_temp_dir and info.temp_dir:
        shutil.rmtree(info.temp_dir, ignore_errors=True)
    clear_state()
    return Stopped(info, count)


def open_dashboard(explicit: str | None = None, token_file: str | None = None) -> Dashboard:
    """resolve_dashboard's dashboard with the token it needs: `token_file` (--token-file), else the `cluster up`
    record's when it is that cluster, else $RAY_AUTH_TOKEN; none for a loopback cluster (auth off)."""
    from rlkit.debug.state import Dashboard  # local import: state imports nothing from here

    url = resolve_dashboard(explicit)
    if not token_file:
        info = load_state()
        if info is not None and info.dashboard_url == url:
            token_file = info.token_file
    if token_file:
        return Dashboard(url, token=ray_token.read_token(token_file), token_source=token_file)
    value = os.environ.get(ray_token.VALUE_ENV)
    return Dashboard(url, token=value or None, token_source=f"${ray_token.VALUE_ENV}" if value else "")


def resolve_dashboard(explicit: str | None = None) -> str:
    """The dashboard to talk to: --dashboard, $RLKIT_DASHBOARD, `cluster up`'s, a running debug run's, :8265."""
    for candidate in (explicit, os.environ.get("RLKIT_DASHBOARD")):
        if candidate:
            return candidate if "://" in candidate else f"http://{candidate}"
    info = running_cluster()
    if info is not None:
        return info.dashboard_url
    runs = running_runs()
    if runs:
        return runs[0].dashboard_url
    default = f"http://{LOOPBACK_IP}:{DEFAULT_DASHBOARD_PORT}"
    if dashboard_alive(default):
        return default
    raise UserError(
        "no Ray cluster is running that rlkit knows of; start one with `rlkit cluster up`"
        " (or pass --dashboard http://HOST:PORT)"
    )
