"""Which network interface a worker's collectives use: the one holding its node's address.

Gloo and NCCL pick an interface on their own (gloo: the one the host name resolves to, often 127.0.1.1 on
Debian/Ubuntu; NCCL: the first non-loopback one, which may be a docker bridge): across nodes that fails or
hangs at the first collective. The node address Ray routes by is the one the others can reach, so each
worker names its interface (`GLOO_SOCKET_IFNAME`, `NCCL_SOCKET_IFNAME`) unless the user set them.
"""

from __future__ import annotations

import ipaddress
import os
import socket

IFNAME_KEYS = {"cpu": ("GLOO_SOCKET_IFNAME",), "cuda": ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")}


def interface_of(ip: str) -> str | None:
    """The name of the local interface holding `ip` (None when no interface has it)."""
    import psutil

    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.family == family and a.address.split("%")[0] == ip for a in addrs):
            return name
    return None


def collective_interface_env(node_ip: str, device_type: str) -> dict[str, str]:
    """The interface variables to set in this worker: those of `device_type`'s backends the user has not set,
    pointed at the interface of `node_ip` (none for a loopback address: one machine, the defaults work)."""
    try:
        if ipaddress.ip_address(node_ip).is_loopback:
            return {}
    except ValueError:
        return {}
    name = interface_of(node_ip)
    if name is None:
        return {}
    return {key: name for key in IFNAME_KEYS.get(device_type, ()) if not os.environ.get(key)}
