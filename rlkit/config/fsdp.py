"""`FSDPConfig`: the FSDP2 settings every model role carries (actor, reference, critic, reward model).

Its own module so the role sections that live outside schema.py (rlkit/config/reward_model.py) use it
without importing schema.py, which imports them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


def f(default: Any = None, help: str = "") -> Any:  # noqa: A002 - "help" reads best in the schema
    return field(default=default, metadata={"help": help})


@dataclass
class FSDPConfig:
    param_offload: bool = f(False, "keep FSDP params on CPU between phases")
    optimizer_offload: bool = f(False, "keep optimizer state on CPU between phases")
    param_dtype: str = f("auto", "compute dtype: auto (bf16 on GPU, fp32 on CPU) | bfloat16 | float32")
    reduce_dtype: str = f("float32", "gradient reduction dtype")
    shard_single_worker: bool = f(
        False,
        "wrap with FSDP2 even with one worker and float32 compute (nothing to "
        "shard there; the plain module trains 10-20% faster, docs/performance.md)",
    )
