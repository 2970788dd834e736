"""`FSDPConfig`: the FSDP2 settings every model role carries (actor, reference, critic, reward model).

Its own module so the role sections that live outside schema.py (rlkit/config/reward_model.py) use it
without importing schema.py, which imports them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlkit.errors import UserError

PARAM_DTYPES = ("auto", "bfloat16", "float32", "float16")
REDUCE_DTYPES = ("float32", "bfloat16", "float16")


def f(default: Any = None, help: str = "") -> Any:  # noqa: A002 - "help" reads best in the schema
    return field(default=default, metadata={"help": help})


@dataclass
class FSDPConfig:
    param_offload: bool = f(False, "keep FSDP params on CPU between phases")
    optimizer_offload: bool = f(False, "keep optimizer state on CPU between phases")
    param_dtype: str = f(
        "auto",
        "compute dtype: auto (bf16 on GPU; on CPU bf16 only where its matmul measured >= 1.3x fp32, e.g. AMX, "
        "else fp32; docs/performance.md) | bfloat16 | float32. bf16 keeps fp32 master weights and optimizer state",
    )
    reduce_dtype: str = f("float32", "gradient reduction dtype")
    dither_master_weights: bool = f(
        True,
        "bf16/fp16 compute: move fp32 masters that sit exactly on the 16-bit grid (a bf16 checkpoint) to a random "
        "point of their rounding cell, so small updates reach the forward (the model computes as loaded; "
        "rlkit/workers/master_dither.py)",
    )
    shard_single_worker: bool = f(
        False,
        "wrap with FSDP2 even with one worker (nothing to shard there: the plain module trains 10-20% faster "
        "in float32, and in bf16 computes on a copy cast once per optimizer step, ~16% faster; "
        "docs/performance.md)",
    )
    fsdp_size: int = f(
        -1,
        "workers per FSDP group: -1 (or n >= the workers) = one group over every worker; n = hybrid sharding "
        "(HSDP): shard within groups of n consecutive workers, replicate over the world / n groups (n divides them)",
    )
    tensor_parallel_size: int = f(
        1,
        "tensor parallel (DTensor): groups of n consecutive workers split every decoder layer's projections, the "
        "embedding and the LM head (vocabulary-parallel log-probs) by the model family's plan, and share their "
        "rows; FSDP2 shards over the world / n data-parallel workers (fsdp_size counts those). n divides the "
        "workers and the model's attention and key/value heads; dense families and Qwen3-MoE/Mixtral, whose experts "
        "and routers stay whole over the group (rlkit/workers/tp_plans.py)",
    )
    expert_parallel_size: int = f(
        1,
        "expert parallel (DTensor, MoE models): groups of n consecutive data-parallel workers (with TP: those of the "
        "same TP index) split every MoE layer's experts, each token's hidden state sent to the worker holding its "
        "expert and back by all-to-all; FSDP2 shards the experts over the data-parallel workers / n, the rest as "
        "without it. n divides the FSDP group (the data-parallel workers, or fsdp_size) and the model's experts; "
        "not with LoRA (rlkit/workers/expert_parallel.py)",
    )
    sequence_parallel: bool = f(
        True,
        "with tensor_parallel_size > 1: the residual stream and the layer norms between the split projections run "
        "on 1/n of the tokens on each worker of a TP group (Megatron's sequence parallel: less activation memory, "
        "the same numbers and communication volume); false keeps them whole on every worker",
    )

    def __post_init__(self) -> None:
        for key, allowed in (("param_dtype", PARAM_DTYPES), ("reduce_dtype", REDUCE_DTYPES)):
            if getattr(self, key) not in allowed:
                raise UserError(
                    f"fsdp_config.{key}='{getattr(self, key)}' is not supported; use one of {list(allowed)}"
                )
        if self.fsdp_size == 0 or self.fsdp_size < -1:
            raise UserError(f"fsdp_config.fsdp_size={self.fsdp_size}: use -1 (one FSDP group over every worker) "
                            "or a group size >= 1 that divides the worker count")
        if self.expert_parallel_size < 1:
            raise UserError(f"fsdp_config.expert_parallel_size={self.expert_parallel_size}: use 1 (no expert "
                            "parallel) or a group size that divides the data-parallel workers")
        if self.tensor_parallel_size < 1:
            raise UserError(f"fsdp_config.tensor_parallel_size={self.tensor_parallel_size}: use 1 (no tensor "
                            "parallel) or a group size that divides the worker count")
