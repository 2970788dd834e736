"""Role classes used by the runtime tests (importable by Ray workers)."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from rlkit.controller import Dispatch, Worker, register
from rlkit.protocol import Batch


class Doubler(Worker):
    def __init__(self, scale: float = 2.0) -> None:
        super().__init__()
        self.scale = scale
        self.seen: list[int] = []

    @register(dispatch=Dispatch.DP_COMPUTE)
    def double(self, batch: Batch) -> Batch:
        self.seen.append(len(batch))
        return Batch({"y": batch["x"] * self.scale, "rank": torch.full((len(batch),), self.rank)}, batch.non_tensors)

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def seen_sizes(self) -> list[int]:
        return self.seen

    @register(dispatch=Dispatch.RANK_ZERO)
    def whoami(self) -> int:
        return self.rank

    @register(dispatch=Dispatch.ALL_TO_ALL)
    def echo(self, value: int) -> tuple[int, int]:
        return self.rank, value

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def all_reduce(self, value: float) -> float:
        self.init_distributed()
        t = torch.tensor([value * (self.rank + 1)])
        dist.all_reduce(t)
        return float(t.item())

    @register(dispatch=Dispatch.DP_COMPUTE)
    def explode(self, batch: Batch) -> Batch:
        if self.rank == 1:
            raise ValueError("boom on purpose")
        return batch


class AddOne(Worker):
    @register(dispatch=Dispatch.DP_COMPUTE)
    def add_one(self, batch: Batch) -> Batch:
        return Batch({"y": batch["y"] + 1}, batch.non_tensors)


class Holder(Worker):
    """Colocated role A: holds a tensor that role B reads in the same process."""

    shared: dict = {}

    def __init__(self) -> None:
        super().__init__()
        Holder.shared["w"] = torch.full((4,), float(self.rank))

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def pid(self) -> int:
        return os.getpid()

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def bump(self) -> None:
        Holder.shared["w"] += 10


class Reader(Worker):
    @register(dispatch=Dispatch.ONE_TO_ALL)
    def pid(self) -> int:
        return os.getpid()

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def read(self) -> list[float]:
        return Holder.shared["w"].tolist()


class TPFollowers(Worker):
    """Ranks 0,1 form tensor-parallel group 0, ranks 2,3 would be group 1: only the first of each collects."""

    def __init__(self, tp: int = 2) -> None:
        super().__init__()
        self.set_dispatch_info(self.rank // tp, self.world_size // tp, self.rank % tp == 0)

    @register(dispatch=Dispatch.DP_COMPUTE)
    def tag(self, batch: Batch) -> Batch:
        return Batch({"x": batch["x"], "by": torch.full((len(batch),), self.rank)})


class Weights(Worker):
    """Colocated role A of the sibling test: owns a tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.full((2,), float(self.rank))

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def bump(self) -> None:
        self.w += 10


class Consumer(Worker):
    """Colocated role B: handed role A at construction (`Sibling("weights")`), no process-global lookup."""

    def __init__(self, source: Worker) -> None:
        super().__init__()
        self.source = source

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def read(self) -> list[float]:
        return self.source.w.tolist()

    @register(dispatch=Dispatch.DP_COMPUTE)
    def step_seen(self, batch: Batch) -> Batch:
        """The step the driver's call carried (rlkit.debug.current_step), per row."""
        from rlkit.debug import current_step

        step = current_step()
        return Batch({"step": torch.full((len(batch),), -1 if step is None else step)})
