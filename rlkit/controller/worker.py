"""`Worker`: the base class of every role (actor, critic, reference, rollout, reward model).

A worker knows its place in its group from environment variables that the
group sets before constructing it (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT), so role code reads like a plain torchrun program.
"""

from __future__ import annotations

import datetime
import os
import socket

import torch
import torch.distributed as dist

from rlkit.controller.decorator import Dispatch, DispatchInfo, register
from rlkit.utils.kernel_caches import bound_kernel_caches

DEFAULT_DIST_TIMEOUT_S = int(os.environ.get("RLKIT_DIST_TIMEOUT_S", "1800"))


#: a worker's process-group backend by its device type. A CUDA worker's group takes CPU tensors too (over gloo):
#: the micro-batch counts, debug flags, `all_gather_object` and the clip norm of CPU-offloaded gradients are CPU
#: tensors, which an NCCL-only group refuses ("No backend type associated with device type cpu"). verl does the same.
PROCESS_GROUP_BACKENDS = {"cuda": "cpu:gloo,cuda:nccl", "cpu": "gloo"}


#: set by a worker group (`rank_env`): "cpu" for a group placed without GPUs. Ray 2.60 no longer hides the GPUs
#: from an actor that asked for none, so a CPU group on a GPU node (trainer.device=cpu) would otherwise take GPU 0
DEVICE_ENV = "RLKIT_DEVICE"


def pick_device() -> torch.device:
    """cuda if this process sees a GPU and its group was placed on GPUs ($RLKIT_DEVICE), else cpu."""
    if os.environ.get(DEVICE_ENV) == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", 0)


def collective_device(group: dist.ProcessGroup | None = None) -> torch.device:
    """Where a small tensor for a collective on `group` may live: the CPU when the group has a backend for CPU
    tensors (gloo, or the CUDA workers' `cpu:gloo,cuda:nccl`), else this process's GPU (a group made as plain
    "nccl", e.g. by a user's script)."""
    config = str(dist.get_backend_config(group))  # "cpu:gloo,cuda:nccl", "cuda:nccl", ...
    device_types = {part.split(":")[0] for part in config.split(",")}
    if "cpu" in device_types:
        return torch.device("cpu")
    return torch.device("cuda")  # the current device (`torch.cuda.set_device` in `init_distributed`)


def free_port() -> int:
    """A port free now, for a process that binds it at once (`reserve_master_port` when a group binds it later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


_RESERVED: dict[tuple[str, int], socket.socket] = {}  # listening sockets rank 0's store takes over


def _listening_socket(addr: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((addr, port))
    sock.listen(128)
    return sock


def reserve_master_port(addr: str) -> int:
    """A port on `addr` that this process keeps bound and listening until its rank 0 builds the group's store.

    A port only looked up (`free_port`) can be taken by another process before rank 0 binds it, seconds later
    when the model is built: a parallel test or a second run on the node then fails with 'Address already in use'.
    """
    sock = _listening_socket(addr, 0)
    port = sock.getsockname()[1]
    _RESERVED[(addr, port)] = sock
    return port


def rendezvous_store(addr: str, port: int, rank: int, world_size: int, timeout: datetime.timedelta) -> dist.Store:
    """The TCPStore `init_method="tcp://addr:port"` would make, but rank 0's server listens on `addr` only.

    torch's store server binds every interface; given a socket bound to MASTER_ADDR (the node IP:
    127.0.0.1 on a single-node cluster) it listens where the group needs it and no wider. Rank 0 takes over
    the socket `reserve_master_port` kept for the port, when this process reserved it.
    """
    if rank != 0:
        return dist.TCPStore(addr, port, world_size, False, timeout=timeout)
    sock = _RESERVED.pop((addr, port), None) or _listening_socket(addr, port)
    return dist.TCPStore(addr, port, world_size, True, timeout=timeout, master_listen_fd=sock.detach())


def node_ip() -> str:
    try:
        import ray

        return ray.util.get_node_ip_address()
    except Exception:
        return "127.0.0.1"


class Worker:
    """Base for role classes. Subclasses call `super().__init__()` first."""

    def __init__(self) -> None:
        bound_kernel_caches()  # before this process's first CPU matmul (rlkit/utils/kernel_caches.py)
        self.rank = int(os.environ.get("RANK", "0"))
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        self.device = pick_device()
        self._dispatch_info = DispatchInfo(self.rank, self.world_size, True)

    # -------------------------------------------------------- distributed
    @property
    def master_addr(self) -> str | None:
        return os.environ.get("MASTER_ADDR")

    @property
    def master_port(self) -> int | None:
        port = os.environ.get("MASTER_PORT")
        return int(port) if port else None

    def init_distributed(self, timeout_s: int | None = None) -> None:
        """Join the group's process group (`PROCESS_GROUP_BACKENDS`: nccl + gloo for CPU tensors on GPU, gloo on
        CPU); a no-op if already joined."""
        if dist.is_initialized():
            return
        if self.master_addr is None or self.master_port is None:
            raise RuntimeError("MASTER_ADDR/MASTER_PORT are not set; was this worker created by a RayWorkerGroup?")
        backend = PROCESS_GROUP_BACKENDS[self.device.type]
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        from rlkit.controller.interfaces import collective_interface_env

        os.environ.update(collective_interface_env(node_ip(), self.device.type))  # the node's routable interface
        timeout = datetime.timedelta(seconds=timeout_s or DEFAULT_DIST_TIMEOUT_S)
        store = rendezvous_store(self.master_addr, self.master_port, self.rank, self.world_size, timeout)
        dist.init_process_group(backend=backend, store=store, rank=self.rank, world_size=self.world_size,
                                timeout=timeout)  # fmt: skip

    # ---------------------------------------------------------- dispatch
    def set_dispatch_info(self, dp_rank: int, dp_size: int, is_collector: bool) -> None:
        """Called by roles that shard differently (e.g. tensor parallel followers are not collectors)."""
        self._dispatch_info = DispatchInfo(dp_rank, dp_size, is_collector)

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def dispatch_info(self) -> DispatchInfo:
        return self._dispatch_info

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def where(self) -> dict:
        """Rank, pid, node and device of this worker (handy in tests and `debug list`)."""
        import ray

        ctx = ray.get_runtime_context() if ray.is_initialized() else None
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "pid": os.getpid(),
            "node_id": ctx.get_node_id() if ctx else None,
            "ip": node_ip(),
            "device": str(self.device),
        }
