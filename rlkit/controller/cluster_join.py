"""`rlkit cluster join`: a Ray worker node on this machine for a head that `rlkit cluster up --listen-all` started.

The head runs with token auth, so the node needs a copy of the head's token file (or $RAY_AUTH_TOKEN).
The token is checked against the head before `ray start` (one line on a wrong one, not Ray's traceback
after 20 s). The node is recorded in `cluster.join.json` beside `cluster up`'s record, so `rlkit
cluster down` stops exactly its processes (never `ray stop`).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

from rlkit.controller import cluster as cl
from rlkit.controller.cluster_auth import check_head, use_token
from rlkit.controller.processes import cluster_processes, stop_processes
from rlkit.debug.listeners import SINGLE_NODE_ENV, is_loopback
from rlkit.errors import UserError
from rlkit.utils import ray_token

JOINED = "rlkit cluster join"
NO_TOKEN = ("no token for the cluster: pass --token-file FILE (a copy of the head's token file, printed by"
            f" `rlkit cluster up`) or set {ray_token.PATH_ENV}")  # fmt: skip


def join_path() -> Path:
    path = cl.state_path()
    return path.with_name(f"{path.stem}.join.json")


def join_temp_dir(port: int) -> str:
    # Not the head's default: the head may run on this machine too (and Ray puts Unix sockets here: keep it short).
    return os.path.join(tempfile.gettempdir(), f"rlkit-node-{port}")


def joined_node() -> cl.ClusterInfo | None:
    """The node `rlkit cluster join` started here, if its processes still run; a stale record is forgotten."""
    info = cl.read_record(join_path())
    if info is not None and cluster_processes(info.temp_dir):
        return info
    join_path().unlink(missing_ok=True)
    return None


def join_cluster(
    address: str,
    token_file: str | None = None,
    num_cpus: float | None = None,
    num_gpus: float | None = None,
    node_ip: str | None = None,
    temp_dir: str | None = None,
    timeout: float = 90.0,
) -> cl.ClusterInfo:
    """Check the token against the head at `address`, then `ray start --address` with it; records the node.

    Sets this process's token environment (the check asks the head from here).
    """
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise UserError(f"{address!r} is not a Ray address; pass the head's HOST:PORT, e.g. 10.0.0.1:6379")
    if is_loopback(host):
        raise UserError(
            f"{address} is a loopback address: a single-node head takes no other node; start the head with"
            " `rlkit cluster up --listen-all` (or --node-ip IP) and join its network address"
        )
    existing = joined_node()
    if existing is not None:
        raise UserError(
            f"this machine already runs a node of the cluster at {existing.address} (`rlkit cluster join`);"
            " stop it with `rlkit cluster down` first"
        )
    if token_file:
        token_file = str(Path(token_file).expanduser().absolute())
        ray_token.read_token(token_file)  # missing, empty or open to others: one line
        use_token(token_file)
        source = token_file
    elif os.environ.get(ray_token.VALUE_ENV):
        os.environ[ray_token.MODE_ENV] = "token"
        source = f"${ray_token.VALUE_ENV}"
    else:
        raise UserError(NO_TOKEN)
    check_head(address, source)
    own_temp_dir = temp_dir is None or not os.path.exists(temp_dir)
    temp_dir = os.path.abspath(temp_dir or join_temp_dir(int(port)))
    if cluster_processes(temp_dir):
        raise UserError(f"Ray processes already use temp dir {temp_dir}; stop them or pass another --temp-dir")
    cmd = [sys.executable, "-m", "ray.scripts.scripts", "start", f"--address={address}", f"--temp-dir={temp_dir}",
           "--disable-usage-stats", *cl.side_port_args(avoid=(int(port),))]  # fmt: skip
    cmd += [f"--node-ip-address={node_ip}"] if node_ip else []
    cmd += [f"--num-cpus={num_cpus:g}"] if num_cpus is not None else []
    cmd += [f"--num-gpus={num_gpus:g}"] if num_gpus is not None else []
    env = cl.with_worker_env({k: v for k, v in os.environ.items() if k != SINGLE_NODE_ENV})  # token env above
    cl.run_ray_start(cmd, env, timeout, temp_dir, None)
    info = cl.ClusterInfo(address=address, dashboard_url="", temp_dir=temp_dir, node_ip=node_ip or "",
                          started_by=JOINED, num_cpus=num_cpus, num_gpus=num_gpus, loopback=False,
                          own_temp_dir=own_temp_dir, token_file=token_file or "")  # fmt: skip
    cl.write_record(join_path(), info)
    return info


def leave_cluster(timeout: float = 5.0) -> cl.Stopped | None:
    """Stop the node `rlkit cluster join` started here and remove its temp dir; None when none was recorded."""
    info = cl.read_record(join_path())
    if info is None:
        return None
    count = stop_processes(info.temp_dir, timeout=timeout)
    if info.own_temp_dir and info.temp_dir:
        shutil.rmtree(info.temp_dir, ignore_errors=True)
    join_path().unlink(missing_ok=True)
    return cl.Stopped(info, count)
