"""A role's tensor-parallel group at run time: the rows its ranks share and the LM head's vocabulary slice.

The ranks of a TP group run one forward together on the union of their rows (`RowGroup.gather_rows`, as a
Ulysses group does), every activation between the split projections replicated over the group, and each rank
keeps its own rows of the result (`own_rows`). Each rank's loss covers its own rows, but the split weights'
backward needs the same upstream gradient on every rank of the group (a replicated activation's gradient is
taken to be replicated): `own_rows`' backward all-reduces the group's row gradients and divides by the group
size, so every rank back-propagates the mean of the group's losses. FSDP2 then averages over the data-parallel
ranks (world / tp), and the product is the world's average, the gradient of the same ranks without TP.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from rlkit.workers.row_group import RowGroup


@dataclass(frozen=True)
class VocabShard:
    """This rank's rows [start, stop) of a vocabulary-parallel LM head (DTensor's Shard(0): torch.chunk's split),
    over the TP group `group`."""

    start: int
    stop: int
    group: Any

    @classmethod
    def of(cls, weight: Any) -> VocabShard:
        """From the head's weight, a DTensor sharded on the vocabulary over a 1-D TP mesh."""
        vocab, local = weight.shape[0], weight.to_local().shape[0]
        mesh = weight.device_mesh
        chunk = math.ceil(vocab / mesh.size())
        start = min(mesh.get_local_rank() * chunk, vocab)
        if local != min(chunk, vocab - start):
            raise RuntimeError(f"vocab-parallel LM head: {local} local rows at {start} of {vocab} is not torch.chunk's")
        return cls(start, start + local, mesh.get_group())


@dataclass(frozen=True)
class TensorParallel(RowGroup):
    mesh: Any  # the 1-D TP device mesh
    vocab: VocabShard | None  # the LM head's slice on this rank (None: a value head, no LM head)
    sequence_parallel: bool = False  # the residual stream split along the sequence (fed lengths: multiples of size)

    def own_rows(self, full: torch.Tensor, own: slice) -> torch.Tensor:
        """This rank's rows of a group-replicated result; backward: the group's mean row gradient (see above)."""
        return _OwnRows.apply(full, own, self.group, self.size)


class _OwnRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, full: torch.Tensor, own: slice, group: Any, size: int) -> torch.Tensor:
        ctx.own, ctx.group, ctx.size, ctx.shape = own, group, size, full.shape
        return full[own].clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        full = grad.new_zeros(ctx.shape)
        full[ctx.own] = grad
        dist.all_reduce(full, group=ctx.group)
        return full.div_(ctx.size), None, None, None


def clip_grad_norm(parameters: Iterable[torch.nn.Parameter], max_norm: float) -> torch.Tensor:
    """The global L2 norm of the gradients, clipped to `max_norm`, over parameters placed on different meshes
    (FSDP2's 1-D data-parallel one for the norms, its 2-D one for the TP-split weights): one norm per mesh, each
    reduced over its own ranks, then combined."""
    from torch.distributed.tensor import DTensor

    params = [p for p in parameters if p.grad is not None]
    by_mesh: dict[Any, list[torch.Tensor]] = {}
    for p in params:
        by_mesh.setdefault(p.grad.device_mesh if isinstance(p.grad, DTensor) else None, []).append(p.grad)
    squares = []
    for grads in by_mesh.values():
        norm = torch.nn.utils.get_total_norm(grads, 2.0, foreach=False)
        squares.append((norm.full_tensor() if isinstance(norm, DTensor) else norm).float().square())
    total = torch.stack(squares).sum().sqrt() if squares else torch.tensor(0.0)
    coef = max_norm / (float(total) + 1e-6)
    if coef < 1.0:  # as torch's clip: grads scaled by max_norm / (norm + 1e-6) when that is below 1
        with torch.no_grad():
            for p in params:
                p.grad.mul_(coef)
    return total
