"""The single-controller runtime: workers, dispatch, resource pools, worker groups."""

from rlkit.controller.decorator import DISPATCH_MODES, Dispatch, DispatchInfo, DispatchMode, Execute, register
from rlkit.controller.futures import DataFuture, WorkerError
from rlkit.controller.resource_pool import ResourcePool
from rlkit.controller.worker import Worker
from rlkit.controller.worker_group import ClassWithInitArgs, RayWorkerGroup, Sibling, WorkerGroupView

__all__ = [
    "DISPATCH_MODES",
    "ClassWithInitArgs",
    "DataFuture",
    "Dispatch",
    "DispatchInfo",
    "DispatchMode",
    "Execute",
    "RayWorkerGroup",
    "ResourcePool",
    "Sibling",
    "Worker",
    "WorkerError",
    "WorkerGroupView",
    "register",
]
