"""The parallel layout of a model role: how its ranks divide the work, as one object every step of building the
model reads (torchtune's `ParallelDims` is the model).

The dimensions, outermost first:
- `replicate`: groups holding whole copies of the sharded parameters (HSDP; verl's `fsdp_size` < world);
- `shard`: the ranks a parameter is sharded over by FSDP2 (`fsdp_size`, the whole world when -1);
- `sp`: Ulysses sequence parallel, groups of `sp` consecutive ranks that share rows and split each packed row
  along the sequence (rlkit/workers/ulysses.py) — a dimension of the layout, not a special case of the forward;
- `tp`: tensor parallel, groups of `tp` consecutive ranks (the mesh's innermost dimension) that share rows and
  split each weight by a plan of the model's family (rlkit/workers/tp_plans.py); FSDP2 then shards over the
  data-parallel ranks alone (`shard` x `replicate` = `world // tp`);
- `ep`: expert parallel, groups of `ep` consecutive data-parallel ranks (with TP: those of the same TP index) that
  split every MoE layer's experts by a plan of the model's family (rlkit/workers/expert_parallel.py); the experts are
  then FSDP2-sharded over the `shard / ep` ranks holding the same ones, everything else as without EP (with
  Ulysses, an EP group's ranks dispatch the tokens of their slices of the packed row). One device mesh
  (replicate, shard / ep, ep, tp) holds every dimension, so DCP checkpoints and `full_tensor()` cross layouts.

Data-parallel ranks (those that get different rows) are `world // (sp * tp)`. A Ulysses or tensor-parallel group
gathers its ranks' rows at each forward (rlkit/workers/row_group.py), so the controller deals rows to every rank
alike. A new dimension is a field here, its check in `check`, its groups or mesh dimension, and the plan that
places the model along it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

TRAINED_BYTES_PER_PARAM = 4 + 4 + 8  # fp32 master, its gradient, AdamW's two fp32 moments
FROZEN_BYTES_PER_PARAM = 4  # a frozen role (the reference) holds fp32 weights


@dataclass(frozen=True)
class Meshes:
    """The device meshes a model is placed on (None: not used): FSDP2's for every parameter but the experts, the
    tensor-parallel one, the expert-parallel one, and FSDP2's for the experts (the ranks holding the same ones)."""

    fsdp: Any
    tp: Any
    ep: Any
    experts_fsdp: Any


@dataclass(frozen=True)
class ParallelLayout:
    world: int
    shard: int
    sp: int = 1
    tp: int = 1
    ep: int = 1

    @classmethod
    def of(cls, fsdp_size: int, sp: int = 1, world: int | None = None, tp: int = 1, ep: int = 1) -> ParallelLayout:
        """The layout of this process group (`world`: its size, read when None) for verl's `fsdp_size` (-1 or a
        size at least the data-parallel ranks: one FSDP group over them), the Ulysses, tensor- and expert-parallel
        sizes."""
        if world is None:
            world = dist.get_world_size() if dist.is_initialized() else 1
        tp = max(tp, 1)
        dp = world // tp if world % tp == 0 else world  # a bad tp is refused by `check` below
        shard = dp if fsdp_size == -1 or fsdp_size >= dp else fsdp_size
        layout = cls(world, shard, max(sp, 1), tp, max(ep, 1))
        layout.check()
        return layout

    def check(self) -> None:
        """Every dimension divides the world (the config checks said so by key; this guards direct use)."""
        if self.tp < 1 or self.world % self.tp:
            raise ValueError(f"fsdp_config.tensor_parallel_size={self.tp} does not divide the {self.world} workers")
        if self.shard < 1 or (self.world // self.tp) % self.shard:
            raise ValueError(f"fsdp_config.fsdp_size={self.shard} must be -1 or divide the "
                             f"{self.world // self.tp} data-parallel workers")
        if self.world % self.sp:
            raise ValueError(f"ulysses_sequence_parallel_size={self.sp} does not divide the {self.world} workers")
        if self.sp > 1 and self.tp > 1:
            raise ValueError("ulysses_sequence_parallel_size > 1 with fsdp_config.tensor_parallel_size > 1: the two "
                             "would split the same attention heads; use one of them")
        if self.ep < 1 or self.shard % self.ep:
            raise ValueError(f"fsdp_config.expert_parallel_size={self.ep} must divide the {self.shard} ranks each "
                             "parameter is sharded over (the data-parallel workers, or fsdp_size)")

    @property
    def replicate(self) -> int:
        return self.world // (self.shard * self.tp)

    @property
    def data_parallel(self) -> int:
        """Ranks that receive different rows."""
        return self.world // (self.sp * self.tp)

    @property
    def mesh_shape(self) -> dict[str, int]:
        """The device mesh's dimensions, outermost first (what the dry run shows per role)."""
        shape = {"replicate": self.replicate, "shard": self.shard, "tp": self.tp}
        return shape if self.ep == 1 else {"replicate": self.replicate, "shard": self.shard // self.ep,
                                           "ep": self.ep, "tp": self.tp}

    def describe(self) -> str:
        """One line: 'replicate 1 x shard 2 x tp 2' (the dimensions of size 1 kept: the layout at a glance); with
        expert parallel 'replicate 1 x shard 1 x ep 2 x tp 1': experts split over ep, sharded over shard, the other
        weights sharded over both."""
        dims = " x ".join(f"{name} {size}" for name, size in self.mesh_shape.items())
        return dims + (f", Ulysses sp {self.sp}" if self.sp > 1 else "")

    def state_bytes_per_rank(self, params: int, trained: bool) -> float:
        """Bytes of model state a rank holds: fp32 weights, plus gradients and AdamW's two moments when trained,
        each split over the shard and tp ranks (copies across `replicate`; activations not counted)."""
        return params * (TRAINED_BYTES_PER_PARAM if trained else FROZEN_BYTES_PER_PARAM) / (self.shard * self.tp)

    def fsdp_mesh(self, device: torch.device) -> Any:
        """FSDP2's mesh: None for one group over the default process group; else (replicate, shard), each
        parameter sharded over `shard` consecutive ranks and replicated over the groups (a collective)."""
        return self.meshes(device).fsdp

    def meshes(self, device: torch.device) -> Meshes:
        """The meshes placing a model, all None for plain FSDP over the default group; otherwise slices of one
        (replicate, shard, tp) device mesh, tp innermost (a TP group is `tp` consecutive ranks), its shard dimension
        unflattened into (shard / ep, ep) with expert parallel (a collective)."""
        if self.replicate == 1 and self.tp == 1 and self.ep == 1:
            return Meshes(None, None, None, None)
        from torch.distributed.device_mesh import init_device_mesh

        if self.ep == 1 and self.tp == 1:
            return Meshes(init_device_mesh(device.type, (self.replicate, self.shard),
                                           mesh_dim_names=("replicate", "shard")), None, None, None)
        if self.ep == 1:
            mesh = init_device_mesh(device.type, tuple(self.mesh_shape.values()),
                                    mesh_dim_names=tuple(self.mesh_shape))
            return Meshes(mesh["replicate", "shard"] if self.replicate > 1 else mesh["shard"], mesh["tp"], None, None)
        names = ("replicate", "expert_shard", "ep", "tp")
        mesh = init_device_mesh(device.type, tuple(self.mesh_shape.values()), mesh_dim_names=names)
        shard = mesh["expert_shard", "ep"]._flatten("shard")
        if self.replicate > 1:
            return Meshes(mesh["replicate", "shard"], mesh["tp"] if self.tp > 1 else None, mesh["ep"],
                          mesh["replicate", "expert_shard"])
        return Meshes(shard, mesh["tp"] if self.tp > 1 else None, mesh["ep"], mesh["expert_shard"])

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
