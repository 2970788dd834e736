"""Ranks that compute on the same rows: a Ulysses group (rlkit/workers/ulysses.py) or a tensor-parallel group
(rlkit/workers/tensor_parallel.py).

The controller deals every rank its own rows (DP_COMPUTE), whatever the layout; a group whose ranks must see the
same rows gathers them at each forward (`gather_rows`) and each rank keeps its own rows of the result. So
neither dimension needs a dispatch mode of its own, and each rank's loss and loss weights stay as without it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class RowGroup:
    size: int
    rank: int  # within the group
    group: Any

    def gather_rows(self, *tensors: torch.Tensor) -> tuple[list[torch.Tensor], slice]:
        """The group's micro-batches stacked in rank order (same columns, any row counts) on every rank of the
        group, and this rank's rows in them."""
        rows = torch.tensor([tensors[0].shape[0]], device=tensors[0].device)
        counts = [torch.zeros_like(rows) for _ in range(self.size)]
        dist.all_gather(counts, rows, group=self.group)
        counts_i = [int(c) for c in counts]
        most = max(counts_i)
        out = []
        for t in tensors:
            padded = torch.cat([t, t.new_zeros((most - t.shape[0], *t.shape[1:]))]) if most > t.shape[0] else t
            parts = [torch.empty_like(padded) for _ in range(self.size)]
            dist.all_gather(parts, padded.contiguous(), group=self.group)
            out.append(torch.cat([p[:n] for p, n in zip(parts, counts_i)]))
        start = sum(counts_i[: self.rank])
        return out, slice(start, start + counts_i[self.rank])

    def gather_objects(self, obj: Any) -> list[Any]:
        """Every group rank's `obj` (picklable, e.g. a dict of CPU tensors of any size) in rank order."""
        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, obj, group=self.group)
        return out
