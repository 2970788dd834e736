"""The single-controller runtime: workers, dispatch, resource pools, worker groups, and the local Ray
cluster that `rlkit cluster up/down` manages (`rlkit.controller.cluster`).

Names are exported lazily: `rlkit cluster` and `rlkit eval` import the cluster records without paying
for (or starting anything in) Ray, which the worker-group modules import at module level.
"""

from importlib import import_module
from typing import Any

_EXPORTS = {
    "DISPATCH_MODES": "decorator",
    "Dispatch": "decorator",
    "DispatchInfo": "decorator",
    "DispatchMode": "decorator",
    "register": "decorator",
    "DataFuture": "futures",
    "WorkerError": "futures",
    "ResourcePool": "resource_pool",
    "Worker": "worker",
    "ClassWithInitArgs": "worker_group",
    "RayWorkerGroup": "worker_group",
    "Sibling": "worker_group",
    "WorkerGroupView": "worker_group",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rlkit.controller' has no attribute {name!r}")
    return getattr(import_module(f"rlkit.controller.{module}"), name)
