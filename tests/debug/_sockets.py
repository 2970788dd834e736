"""Listening sockets of given processes, read from /proc (independent of the psutil code rlkit uses).

A socket is owned by a pid when /proc/PID/fd has a link `socket:[INODE]`; /proc/net/{tcp,tcp6}
list TCP sockets with state 0A (LISTEN), /proc/net/{udp,udp6} unconnected (receiving) UDP sockets.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from dataclasses import dataclass
from pathlib import Path

_TABLES = {"tcp": socket.AF_INET, "tcp6": socket.AF_INET6, "udp": socket.AF_INET, "udp6": socket.AF_INET6}
_LISTEN = "0A"


@dataclass(frozen=True)
class Sock:
    proto: str
    ip: str
    port: int
    pid: int
    process: str

    @property
    def loopback(self) -> bool:
        addr = ipaddress.ip_address(self.ip)
        return bool((getattr(addr, "ipv4_mapped", None) or addr).is_loopback)

    def __str__(self) -> str:
        return f"{self.proto} {self.ip}:{self.port} pid {self.pid} ({self.process})"


def _inodes(pid: int) -> set[int]:
    out = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                out.add(int(link[8:-1]))
    except OSError:
        pass
    return out


def _decode(hex_addr: str, family: int) -> tuple[str, int]:
    host, port = hex_addr.split(":")
    raw = bytes.fromhex(host)
    # The kernel prints each 32-bit word in host (little-endian) order.
    raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return socket.inet_ntop(family, raw), int(port, 16)


def _name(pid: int) -> str:
    try:
        args = [a.decode(errors="replace") for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
        if not args:
            return "?"
        words = [os.path.basename(args[0])] + [os.path.basename(a) for a in args[1:3] if not a.startswith("--")]
        return " ".join(words)[:80]
    except OSError:
        return "?"


def listening(pids: list[int] | None, port: int | None = None) -> list[Sock]:
    """TCP sockets in LISTEN and unconnected UDP sockets owned by `pids` (None: any process; pid 0 when
    not ours to see), or only those on `port`."""
    owner = {inode: pid for pid in pids for inode in _inodes(pid)} if pids is not None else None
    found = []
    for proto, family in _TABLES.items():
        try:
            lines = Path(f"/proc/net/{proto}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            local, remote, state, inode = cols[1], cols[2], cols[3], int(cols[9])
            if (owner is not None and inode not in owner) or (proto.startswith("tcp") and state != _LISTEN):
                continue
            if proto.startswith("udp") and remote.split(":")[1] != "0000":
                continue  # a connected UDP socket (a client's) receives from its peer only
            ip, at = _decode(local, family)
            if port is not None and at != port:
                continue
            pid = owner[inode] if owner is not None else 0
            found.append(Sock(proto, ip, at, pid, _name(pid) if pid else "?"))
    return sorted(found, key=lambda s: (s.port, s.proto))
