"""The parallel layout of a model role: how its ranks divide the work, as one object every step of building the
model reads (torchtune's `ParallelDims` is the model).

The dimensions, outermost first:
- `replicate`: groups holding whole copies of the sharded parameters (HSDP; verl's `fsdp_size` < world);
- `shard`: the ranks a parameter is sharded over by FSDP2 (`fsdp_size`, the whole world when -1);
- `sp`: Ulysses sequence parallel, groups of `sp` consecutive ranks that share rows and split each packed row
  along the sequence (rlkit/workers/ulysses.py) — a dimension of the layout, not a special case of the forward;
- `tp`, `ep`: tensor and expert parallel, 1 until their plans exist (issue 46's room).

Data-parallel ranks (those that get different rows) are `world // (sp * tp)`. A new dimension is a field here,
its check in `check`, its groups or mesh dimension, and the plan that places the model along it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class ParallelLayout:
    world: int
    shard: int
    sp: int = 1
    tp: int = 1
    ep: int = 1

    @classmethod
    def of(cls, fsdp_size: int, sp: int = 1, world: int | None = None) -> ParallelLayout:
        """The layout of this process group (`world`: its size, read when None) for verl's `fsdp_size` (-1 or a
        size at least the world: one FSDP group) and the Ulysses size."""
        if world is None:
            world = dist.get_world_size() if dist.is_initialized() else 1
        shard = world if fsdp_size == -1 or fsdp_size >= world else fsdp_size
        layout = cls(world, shard, max(sp, 1))
        layout.check()
        return layout

    def check(self) -> None:
        """Every dimension divides the world (the config checks said so by key; this guards direct use)."""
        if self.shard < 1 or self.world % self.shard:
            raise ValueError(f"fsdp_config.fsdp_size={self.shard} must be -1 or divide the {self.world} workers")
        if self.world % self.sp:
            raise ValueError(f"ulysses_sequence_parallel_size={self.sp} does not divide the {self.world} workers")
        if self.tp != 1 or self.ep != 1:
            raise ValueError("tensor and expert parallel training are not implemented yet (tp = ep = 1)")

    @property
    def replicate(self) -> int:
        return self.world // self.shard

    @property
    def data_parallel(self) -> int:
        """Ranks that receive different rows."""
        return self.world // (self.sp * self.tp)

    def fsdp_mesh(self, device: torch.device) -> Any:
        """FSDP2's mesh: None for one group over the default process group; else (replicate, shard), each
        parameter sharded over `shard` consecutive ranks and replicated over the groups (a collective)."""
        if self.replicate == 1:
            return None
        from torch.distributed.device_mesh import init_device_mesh

        return init_device_mesh(device.type, (self.replicate, self.shard), mesh_dim_names=("replicate", "shard"))

    def sequence_parallel(self, config: Any) -> Any:
        """This rank's Ulysses group (None when sp is 1), after checking that `config`'s attention heads split
        over it (a collective on first use)."""
        from rlkit.workers import ulysses

        if self.sp == 1:
            return None
        text = config.get_text_config()  # a VLM's language model's (the attention split over the group)
        ulysses.check_heads(text.num_attention_heads,
                            getattr(text, "num_key_value_heads", None) or text.num_attention_heads, self.sp, "")
        return ulysses.SequenceParallel.create(self.sp)
