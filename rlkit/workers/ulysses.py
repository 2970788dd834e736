"""Ulysses sequence parallelism: a packed row split along the sequence over a group of ranks.

Groups: `sp` consecutive ranks of the data-parallel world form one group (`SequenceParallel.create`;
every rank creates every group, as `new_group` requires). Data stays as the controller dispatched it:
each rank keeps its own shard, micro-batches and loss weights, as without SP. At every forward the
group all-gathers its ranks' micro-batches (`gather_rows`), runs their union as one packed row split
over the group, and each rank keeps its own rows of the result. The ranks of a group therefore call
forward equally often (equal shards, and dynamic micro-batching agrees on the count across ranks).

Forward: the packed row (rlkit/workers/packing.py, padded to a multiple of `sp`) is cut into `sp`
slices; each rank embeds its slice with the slice's own position ids. Inside every attention layer
(rlkit/workers/varlen_attention.py) an all-to-all turns the local (T/sp tokens, all heads) q/k/v into
(all T tokens, heads/sp), the varlen kernel attends over whole sequences, and a second all-to-all turns
the output back. Key/value heads: split among the group when their count divides by `sp`, otherwise
every rank's key/value heads are repeated up to the query heads first (replicated: correct, more traffic).
Log-probs/entropies/values are all-gathered back to the full row (autograd-aware).

Images (a vision-language model): the group's images are gathered with its rows, in rank order (`gather_objects`),
every rank runs the vision tower and the embedding merge on the whole packed row, and its language model reads
this rank's slice of the merged embeddings (rlkit/models/vision.py `text_embeddings_sliced`).

Gradients: each rank's loss covers only its own rows, weighted as without SP (`loss_scales`). The
all-gather's backward sums what every rank's loss sends to a slice, so the group's parameter
gradients add up to the gradient of the sum of its ranks' losses, exactly what the same ranks
compute without SP; FSDP's average over the world then gives the SP=1 gradient, with no extra scale.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from rlkit.workers.row_group import RowGroup

GROUP_KWARG = "ulysses_group"  # the forward kwarg that carries the group down to the attention function
_GROUPS: dict[int, Any] = {}


@dataclass(frozen=True)
class SequenceParallel(RowGroup):
    """A Ulysses group: a `RowGroup` (its ranks gather their rows) that also splits the packed row among them."""

    @classmethod
    def create(cls, size: int) -> SequenceParallel | None:
        """This rank's group of `size` consecutive ranks (None for size 1). A collective on first use."""
        if size <= 1:
            return None
        world = dist.get_world_size() if dist.is_initialized() else 1
        if world % size:
            raise ValueError(f"ulysses_sequence_parallel_size={size} does not divide the {world} workers")
        if size not in _GROUPS:
            rank = dist.get_rank()
            for start in range(0, world, size):
                group = dist.new_group(list(range(start, start + size)))
                if start <= rank < start + size:
                    _GROUPS[size] = group
        group = _GROUPS[size]
        return cls(size, dist.get_rank(group), group)

    def slice(self, length: int) -> tuple[int, int]:
        """This rank's [lo, hi) of a packed row of `length` (a multiple of size)."""
        local = length // self.size
        return self.rank * local, (self.rank + 1) * local

    def gather(self, local: torch.Tensor) -> torch.Tensor:
        """(T/sp, ...) on each rank -> (T, ...) in rank order; backward sums the group's gradients."""
        return _GatherSequence.apply(local, self.group)


class _AllToAll(torch.autograd.Function):
    """Chunk i of dim 0 goes to rank i; received chunk j came from rank j. With equal chunks it is its own
    inverse, so the backward is the same all-to-all of the gradient."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        x = x.contiguous()
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
        dist.all_to_all_single(out, x, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _AllToAll.apply(grad, ctx.group), None


class _GatherSequence(torch.autograd.Function):
    """(n, ...) on each rank -> (sp * n, ...) in rank order. Backward: the sum of every rank's gradient of this
    rank's slice (an all-reduce, then the slice: gloo has no reduce-scatter)."""

    @staticmethod
    def forward(ctx: Any, local: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group, ctx.n = group, local.shape[0]
        parts = [
            torch.empty_like(local, memory_format=torch.contiguous_format) for _ in range(dist.get_world_size(group))
        ]
        dist.all_gather(parts, local.contiguous(), group=group)
        return torch.cat(parts, 0)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        rank = dist.get_rank(ctx.group)
        return grad[rank * ctx.n : (rank + 1) * ctx.n], None


def _all_to_all(x: torch.Tensor, group: Any) -> torch.Tensor:
    return _AllToAll.apply(x, group)


def _heads_to_sequence_one(x: torch.Tensor, sp: int, group: Any) -> torch.Tensor:
    """(T/sp, h, d) -> (T, h/sp, d)."""
    tl, h, d = x.shape
    send = x.reshape(tl, sp, h // sp, d).transpose(0, 1)  # (sp, T/sp, h/sp, d): head chunk j -> rank j
    return _all_to_all(send, group).reshape(sp * tl, h // sp, d)  # chunk i = sequence slice i


def heads_to_sequence(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: Any
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Local (T/sp, H, d) q and (T/sp, Hkv, d) k/v -> the whole sequence for this rank's share of the heads."""
    sp = dist.get_world_size(group)
    heads, kv_heads = q.shape[1], k.shape[1]
    if kv_heads % sp:  # too few key/value heads to split: repeat them up to the query heads (GQA groups kept)
        k, v = (t.repeat_interleave(heads // kv_heads, dim=1) for t in (k, v))
    return tuple(_heads_to_sequence_one(t, sp, group) for t in (q, k, v))  # type: ignore[return-value]


def sequence_to_heads(out: torch.Tensor, group: Any) -> torch.Tensor:
    """(T, H/sp, d) attention output -> this rank's (T/sp, H, d)."""
    sp = dist.get_world_size(group)
    t, h, d = out.shape
    recv = _all_to_all(out.reshape(sp, t // sp, h, d), group)  # chunk j = head chunk j, my sequence slice
    return recv.transpose(0, 1).reshape(t // sp, sp * h, d)


def check_heads(num_heads: int, num_kv_heads: int, sp: int, what: str) -> None:
    """Raise a clear error when the model's heads cannot be split over the group."""
    if sp > 1 and num_heads % sp:
        raise ValueError(
            f"{what}ulysses_sequence_parallel_size={sp} must divide the model's num_attention_heads="
            f"{num_heads} (each rank attends with heads/sp of them)"
        )
    if sp > 1 and num_kv_heads % sp and num_heads % num_kv_heads:
        raise ValueError(
            f"{what}num_attention_heads={num_heads} is not a multiple of num_key_value_heads={num_kv_heads}"
        )
