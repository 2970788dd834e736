"""The trainer side of the sliced weight sync: each parameter cut to what this rank's engine needs, in buckets.

The engine's TP group is `tp` consecutive ranks (external_launcher on the trainer's world), so the engine layout of
a sliced weight is `Shard(dim)` over an innermost mesh dimension of size `tp`. A parameter's DTensor is viewed on
such a mesh and `redistribute`d there (DTensor's own shard-to-shard re-cut); `to_local()` is then exactly this
rank's slice:
- the trainer's own TP mesh when its innermost dimension is the engine's group (trainer TP = engine TP: only
  FSDP's gather over the data-parallel ranks runs, a column/row-parallel weight needs no collective over TP);
- otherwise the trainer mesh with its innermost dimension split in (size / tp, tp), the placements split alike
  (FSDP2's Shard(0) over s ranks = Shard(0) over s / tp, then over tp), trusted only where every rank's shard
  keeps its shape and offset on the view (checked for all ranks, so every rank takes the same collective).
A slice that is not torch.chunk's piece (`Cut.is_chunk`), or a mesh that has no such view, is gathered whole and
narrowed (counted in `SliceStats.gathered`); a weight the engine keeps whole is gathered whole.

Slices are handed over in buckets of `SlicePlan.bucket_bytes` (`rollout.update_weights_bucket_megabytes`): what
the sync holds beyond the engine's weights is one bucket, plus one parameter's gather in flight.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from rlkit.rollout.slice_plan import Cut, SlicePlan, SliceStats


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class EngineCutter:
    """Cuts DTensors to one engine rank's slices; caches the engine-shaped view of each trainer mesh (a mesh is
    built collectively: every rank cuts the same parameters in the same order)."""

    def __init__(self, tp: int, tp_rank: int) -> None:
        self.tp, self.tp_rank = tp, tp_rank
        self.views: dict[int, Any] = {}

    def cut(self, x: torch.Tensor, cut: Cut) -> tuple[torch.Tensor, bool]:
        """(this rank's slice of `x`, whether it came straight from a re-cut)."""
        from torch.distributed.tensor import DTensor

        if cut.dim is None:
            return (x.full_tensor() if isinstance(x, DTensor) else x), True
        if isinstance(x, DTensor) and cut.is_chunk(x.shape[cut.dim], self.tp, self.tp_rank):
            view = self._engine_view(x)
            if view is not None:
                from torch.distributed.tensor import Replicate, Shard

                target = [Replicate()] * (view.device_mesh.ndim - 1) + [Shard(cut.dim)]
                return view.redistribute(view.device_mesh, target).to_local(), True
        whole = x.full_tensor() if isinstance(x, DTensor) else x
        return whole.narrow(cut.dim, cut.start, cut.length), False

    def _engine_view(self, x: Any) -> Any:
        """`x` on a mesh whose innermost dimension is this rank's engine TP group, or None (the same answer on
        every rank: what follows is a collective)."""
        from torch.distributed.tensor import DTensor, Replicate, Shard

        mesh = x.device_mesh
        ranks = mesh.mesh.flatten().tolist()
        if ranks != list(range(dist.get_world_size())) or mesh.size(-1) % self.tp:
            return None
        if mesh.size(-1) == self.tp:
            return x
        last = x.placements[-1]
        if type(last) not in (Shard, Replicate):
            return None  # a strided shard (FSDP2 on top of TP): no split of that dimension here
        shape = (*mesh.shape[:-1], mesh.size(-1) // self.tp, self.tp)
        placements = (*x.placements[:-1], last, last)
        if not _same_pieces(tuple(x.shape), tuple(mesh.shape), tuple(x.placements), shape, placements):
            return None  # uneven chunks that nest differently
        key = id(mesh)
        if key not in self.views:
            from torch.distributed.device_mesh import DeviceMesh

            self.views[key] = DeviceMesh(mesh.device_type, mesh.mesh.reshape(shape))
        return DTensor.from_local(x.to_local(), self.views[key], placements, shape=x.shape, stride=x.stride())


def _same_pieces(global_shape: tuple[int, ...], mesh_shape: tuple[int, ...], placements: tuple,
                 view_shape: tuple[int, ...], view_placements: tuple) -> bool:
    """Every rank's local shape and offset are the same on the mesh and on its view (checked for all ranks, so
    every rank decides alike; torch's own chunk arithmetic, a private helper of DTensor)."""
    from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset as piece

    def coordinate(rank: int, shape: tuple[int, ...]) -> list[int]:
        out = []
        for size in reversed(shape):
            rank, c = divmod(rank, size)
            out.append(c)
        return out[::-1]

    world = math.prod(mesh_shape)
    return all(piece(global_shape, mesh_shape, coordinate(r, mesh_shape), placements)
               == piece(global_shape, view_shape, coordinate(r, view_shape), view_placements) for r in range(world))


def engine_slices(named: Iterator[tuple[str, torch.Tensor]], plan: SlicePlan, stats: SliceStats
                  ) -> Iterator[list[tuple[Cut, torch.Tensor]]]:
    """Buckets of (cut, this rank's slice) for every planned tensor of `named` (the module's state dict: sharded
    parameters, unmaterialised); a collective, as `iter_full_params`."""
    if dist.get_rank() % plan.tp_size != plan.tp_rank:  # the re-cut takes engine groups of consecutive ranks
        raise RuntimeError(f"engine TP rank {plan.tp_rank} of {plan.tp_size} on world rank {dist.get_rank()}: the "
                           "sliced sync needs the engine's TP groups to be consecutive ranks (external_launcher)")
    cutter = EngineCutter(plan.tp_size, plan.tp_rank)
    bucket: list[tuple[Cut, torch.Tensor]] = []
    held = 0
    for name, x in named:
        cut = plan.cuts.get(name)
        if cut is None:
            continue
        piece, direct = cutter.cut(x.detach(), cut)
        if not direct:
            stats.gathered.append(name)
        size = _nbytes(piece)
        stats.bytes += size
        if cut.dim is not None:
            stats.sharded_bytes += size
            stats.sharded_full_bytes += x.numel() * x.element_size()
        if bucket and held + size > plan.bucket_bytes:
            yield bucket
            bucket, held = [], 0
        bucket.append((cut, piece))
        held += size
        stats.peak_bucket_bytes = max(stats.peak_bucket_bytes, held)
    if bucket:
        yield bucket
