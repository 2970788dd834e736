"""`@register`: how a driver call on a worker group maps to calls on its ranks.

A dispatch mode is a pair of functions: `split` turns the driver's arguments
into one (args, kwargs) per worker (or None to skip a worker), `collect` turns
the workers' outputs back into one driver value (of the ranks `collected` picks,
when the mode has it: DP_COMPUTE keeps one per shard). Modes live in a registry, so a
new mode plugs in with `DISPATCH_MODES.add(name, DispatchMode(...))` and no
group code changes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from rlkit.protocol import Batch
from rlkit.registry import Registry

ATTR = "_rlkit_register"


class Dispatch:
    """Names of the built-in dispatch modes (strings, so configs and plugins can use them too)."""

    ONE_TO_ALL = "one_to_all"
    ALL_TO_ALL = "all_to_all"
    DP_COMPUTE = "dp_compute"
    RANK_ZERO = "rank_zero"


@dataclass(frozen=True)
class DispatchInfo:
    """Where a worker sits in the data-parallel layout of its group."""

    dp_rank: int
    dp_size: int
    is_collector: bool = True


class DispatchTarget(Protocol):
    """What a dispatch mode reads of a worker group (a `WorkerGroupView` is one); declared here so this
    module does not import the group that imports it."""

    world_size: int

    def dispatch_info(self) -> list[DispatchInfo]: ...


@dataclass
class CallPlan:
    """Per-worker arguments (None = this worker is not called) plus context for `collect`."""

    per_worker: list[tuple[tuple, dict] | None]
    context: dict[str, Any]


@dataclass(frozen=True)
class DispatchMode:
    split: Callable[[DispatchTarget, tuple, dict], CallPlan]
    collect: Callable[[DispatchTarget, list[Any], CallPlan], Any]
    #: the called ranks whose outputs `collect` receives, in that order (None: all of them, by rank). The other
    #: calls are still waited on, so their errors surface, but their outputs are dropped (tensor-parallel followers)
    collected: Callable[[CallPlan, list[int]], list[int]] | None = None


DISPATCH_MODES: Registry[DispatchMode] = Registry("dispatch mode")


@dataclass(frozen=True)
class RegisterSpec:
    dispatch: str
    blocking: bool


def register(dispatch: str = Dispatch.ALL_TO_ALL, blocking: bool = True) -> Callable:
    """Mark a worker method as callable from the driver through its group.

    Calling the method directly inside the worker process is unaffected.
    """
    DISPATCH_MODES.get(dispatch)  # fail at import time on a typo

    def deco(fn: Callable) -> Callable:
        setattr(fn, ATTR, RegisterSpec(dispatch, blocking))
        return fn

    return deco


def get_register_spec(fn: Any) -> RegisterSpec | None:
    return getattr(fn, ATTR, None)


# ----------------------------------------------------------------- built-ins
def _one_to_all_split(group: DispatchTarget, args: tuple, kwargs: dict) -> CallPlan:
    return CallPlan([(args, kwargs)] * group.world_size, {})


def _list_collect(group: DispatchTarget, outputs: list[Any], plan: CallPlan) -> list[Any]:
    return outputs


def _all_to_all_split(group: DispatchTarget, args: tuple, kwargs: dict) -> CallPlan:
    n = group.world_size
    for i, a in enumerate(list(args) + list(kwargs.values())):
        if not isinstance(a, (list, tuple)) or len(a) != n:
            raise ValueError(f"ALL_TO_ALL: argument {i} must be a list with one entry per worker ({n})")
    per = [(tuple(a[r] for a in args), {k: v[r] for k, v in kwargs.items()}) for r in range(n)]
    return CallPlan(per, {})


def _rank_zero_split(group: DispatchTarget, args: tuple, kwargs: dict) -> CallPlan:
    return CallPlan([(args, kwargs)] + [None] * (group.world_size - 1), {})


def _rank_zero_collect(group: DispatchTarget, outputs: list[Any], plan: CallPlan) -> Any:
    return outputs[0]


def _dp_split(group: DispatchTarget, args: tuple, kwargs: dict) -> CallPlan:
    from rlkit.controller.futures import DataFuture

    infos = group.dispatch_info()
    dp_size = infos[0].dp_size
    pads: set[int] = set()

    def shard(value: Any) -> Any:
        if isinstance(value, Batch):
            padded, pad = value.pad_to_divisor(dp_size)
            pads.add(pad)
            return padded.chunk(dp_size)
        if isinstance(value, DataFuture):
            chunks, pad = value.chunk_refs(dp_size)
            pads.add(pad)
            return chunks
        return None

    sharded_args = [shard(a) for a in args]
    sharded_kwargs = {k: shard(v) for k, v in kwargs.items()}
    if len(pads) > 1:
        raise ValueError(f"DP_COMPUTE: Batch arguments of different lengths (pads {sorted(pads)})")
    per = []
    for info in infos:
        a = tuple(s[info.dp_rank] if s is not None else v for s, v in zip(sharded_args, args))
        kw = {k: (sharded_kwargs[k][info.dp_rank] if sharded_kwargs[k] is not None else v) for k, v in kwargs.items()}
        per.append((a, kw))
    return CallPlan(per, {"pad": pads.pop() if pads else 0, "infos": infos})


def _dp_collected(plan: CallPlan, ranks: list[int]) -> list[int]:
    """One output per data-parallel shard: the collector of each, in dp_rank order."""
    infos: list[DispatchInfo] = plan.context["infos"]
    return sorted((r for r in ranks if infos[r].is_collector), key=lambda r: infos[r].dp_rank)


def _dp_collect(group: DispatchTarget, outputs: list[Any], plan: CallPlan) -> Any:
    if outputs and all(isinstance(v, Batch) for v in outputs):
        return Batch.concat(outputs).unpad(plan.context["pad"])
    return outputs


DISPATCH_MODES.add(Dispatch.ONE_TO_ALL, DispatchMode(_one_to_all_split, _list_collect))
DISPATCH_MODES.add(Dispatch.ALL_TO_ALL, DispatchMode(_all_to_all_split, _list_collect))
DISPATCH_MODES.add(Dispatch.RANK_ZERO, DispatchMode(_rank_zero_split, _rank_zero_collect))
DISPATCH_MODES.add(Dispatch.DP_COMPUTE, DispatchMode(_dp_split, _dp_collect, _dp_collected))
