"""Find and stop the processes of one Ray cluster on this machine, and probe local ports.

A cluster is known by its private temp dir (every Ray process but the client server names it on
its command line) and its GCS port (the client server names `--address=HOST:PORT`). We never
`ray stop`: that would take down every Ray cluster on a shared machine.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable
from typing import Any


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host if host != "0.0.0.0" else "", port))
        except OSError:
            return True
    return False


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(count: int, avoid: Iterable[int] = ()) -> list[int]:
    """`count` distinct ports free now, none of them in `avoid` (ports the same command already names). Each
    socket stays bound until all are picked (ports looked up one at a time can come back as the same number), and
    a number seen twice is skipped all the same."""
    held: list[socket.socket] = []
    picked: list[int] = []
    try:
        while len(picked) < count:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            held.append(s)
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
            if port not in avoid and port not in picked:
                picked.append(port)
    finally:
        for s in held:
            s.close()
    return picked


def pid_alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def cluster_processes(temp_dir: str, gcs_port: int | None = None) -> list:
    """Processes of the cluster in `temp_dir` (and, given its GCS port, its client server), plus descendants."""
    import psutil

    if not temp_dir:
        return []
    temp_dir = os.path.abspath(temp_dir)
    roots = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        args = proc.info.get("cmdline") or []
        if proc.pid != os.getpid() and (
            any(_names_dir(a, temp_dir) for a in args) or _is_client_server_of(args, gcs_port)
        ):
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


def _is_client_server_of(args: list[str], gcs_port: int | None) -> bool:
    """Ray's client server is started with `--address=<node ip>:<gcs port>` and no temp dir."""
    if not gcs_port or "ray.util.client.server" not in args:
        return False
    return any(a.startswith("--address=") and a.endswith(f":{gcs_port}") for a in args)


def stop_processes(temp_dir: str, timeout: float = 5.0, gcs_port: int | None = None) -> int:
    """SIGTERM, then SIGKILL after `timeout` s, every process of the cluster; returns the count.

    raylet and gcs_server drain for 10-15 s on SIGTERM; a local dev head has nothing worth that wait.
    """
    import psutil

    procs = cluster_processes(temp_dir, gcs_port)
    for proc in procs:
        try:
            proc.terminate()
        except psutil.Error:
            pass
    end_processes(procs, timeout, kill_wait_s=5)
    return len(procs)


def end_processes(procs: list[Any], grace_s: float = 3.0, kill_wait_s: float | None = None) -> None:
    """Wait `grace_s` for `procs` to exit (after whatever asked them to), then kill the ones left and wait for them
    (`kill_wait_s`, default `grace_s`)."""
    import psutil

    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=grace_s if kill_wait_s is None else kill_wait_s)
