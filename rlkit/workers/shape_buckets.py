"""Token counts rounded up to a bucket, so low-precision CPU matmuls see few distinct shapes.

On CPU, bf16/fp16 matmuls run through oneDNN, which JIT-compiles a kernel per matrix shape and keeps it in its
primitive cache (1024 entries; about 1 MB of heap plus JIT code each, measured with torch 2.13 on an AMX Xeon).
A packed micro-batch's token count changes every step, so every step added a few dozen primitives: the SmolLM2
quickstart worker's RSS rose ~55 MB/step for its first 20 steps (bench/results/soak.md) until the cache was full
(~1.5 GB), and each new shape paid its JIT. Padding the packed row and the LM head's rows to a multiple of
`CPU_LOW_PRECISION_BUCKET` keeps a handful of shapes per length range; the padding is a segment of its own
(packed rows) or repeated head rows, and is dropped before any value leaves the forward. fp32 CPU matmuls (MKL)
and GPU kernels keep no per-shape state, so there the bucket is 1 (no padding, numerics untouched).
"""

from __future__ import annotations

import torch

CPU_LOW_PRECISION_BUCKET = 64


def token_bucket(device: torch.device | str, dtype: torch.dtype) -> int:
    """The multiple token counts are padded to for a model computing in `dtype` on `device`."""
    low = dtype in (torch.bfloat16, torch.float16)
    return CPU_LOW_PRECISION_BUCKET if torch.device(device).type == "cpu" and low else 1


def pad_rows(index: torch.Tensor, multiple: int) -> torch.Tensor:
    """`index` (K,) with its last entry repeated up to a multiple of `multiple` (K = 0 stays empty)."""
    pad = -index.numel() % multiple
    if pad == 0 or index.numel() == 0:
        return index
    return torch.cat([index, index[-1:].expand(pad)])
