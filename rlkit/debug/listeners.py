"""Where a Ray cluster listens, and how a single-node one is kept on loopback.

Ray 2.60 binds its servers (GCS, raylet and object manager, core workers, dashboard agent,
runtime-env agent, metrics, client server) to the *node IP*, and turns `--node-ip-address=127.0.0.1`
back into the machine's network address (`ray._private.services.resolve_ip_for_localhost`),
except in its single-machine mode, `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0` (the default on macOS
and Windows). In that mode the node IP is 127.0.0.1: every service, every worker's gRPC server
and a paused worker's debugpy listen on loopback, and no other node can join (`ray start
--address` refuses). Measured here: with it, all listening sockets of `ray start --head` are on
127.0.0.1; without it, GCS, raylet and agent ports are on `*` and the client server on the node IP.

Token auth is off on loopback clusters (the VS Code extension sends none), so whoever reaches a
port can run code: loopback is the default, the network an explicit choice (with Ray's token auth
on: rlkit.utils.ray_token).
"""

from __future__ import annotations

import ipaddress
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass

LOOPBACK_IP = "127.0.0.1"
# Ray's single-machine switch (read by ray._private.ray_constants at import, inherited by every Ray process).
SINGLE_NODE_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
LOOPBACK_ENV = {SINGLE_NODE_ENV: "0"}

# What a Ray process is, from its command line (first match wins): for the `cluster up` report.
_SERVICES = (
    ("gcs_server", "GCS"),
    ("raylet", "raylet + object manager"),
    ("dashboard/dashboard.py", "dashboard"),
    ("ray::DashboardAgent", "dashboard agent (+ metrics)"),
    ("dashboard/agent.py", "dashboard agent (+ metrics)"),
    ("ray::RuntimeEnvAgent", "runtime-env agent"),
    ("runtime_env/agent/main.py", "runtime-env agent"),
    ("ray.util.client.server", "client server"),
    ("autoscaler/_private/monitor.py", "autoscaler monitor"),
    ("log_monitor.py", "log monitor"),
    ("debugpy", "debugpy"),
    ("ray::", "worker"),
    ("default_worker.py", "worker"),
)


def use_loopback_node() -> None:
    """Before a driver starts its own Ray (`ray.init(address="local")`): one machine, every port on 127.0.0.1.

    The variable reaches the Ray processes this driver starts through the environment. Ray reads it
    once at import, so when Ray is already imported the module constant gets the value it would have read.
    """
    os.environ.update(LOOPBACK_ENV)
    constants = sys.modules.get("ray._private.ray_constants")
    if constants is not None:
        constants.ENABLE_RAY_CLUSTER = False  # type: ignore[attr-defined]


def is_loopback(ip: str) -> bool:
    """127.0.0.0/8, ::1 and IPv4-mapped loopback (::ffff:127.0.0.1); the wildcard is not."""
    try:
        addr = ipaddress.ip_address(ip.split("%", 1)[0])
    except ValueError:
        return ip == "localhost"
    mapped = getattr(addr, "ipv4_mapped", None)
    return bool((mapped or addr).is_loopback)


def service_of(cmdline: list[str], name: str = "") -> str:
    text = " ".join(cmdline) or name
    return next((label for marker, label in _SERVICES if marker in text), name or "?")


@dataclass(frozen=True)
class Listener:
    ip: str
    port: int
    pid: int
    service: str

    @property
    def loopback(self) -> bool:
        return is_loopback(self.ip)

    def __str__(self) -> str:
        host = "*" if self.ip in ("0.0.0.0", "::") else self.ip
        return f"{host}:{self.port} ({self.service}, pid {self.pid})"


def listeners(procs: Iterable) -> list[Listener]:
    """Listening TCP sockets of `procs` (psutil.Process), sorted by port."""
    import psutil

    found = set()
    for proc in procs:
        try:
            service = service_of(proc.cmdline(), proc.name())
            for conn in proc.net_connections(kind="tcp"):
                if conn.status == psutil.CONN_LISTEN and conn.laddr:
                    found.add(Listener(conn.laddr.ip, conn.laddr.port, proc.pid, service))
        except psutil.Error:
            continue
    return sorted(found, key=lambda item: (item.port, item.ip))


def exposed(found: Iterable[Listener]) -> list[Listener]:
    return [item for item in found if not item.loopback]
