"""Timing a CPU matmul: the one measuring function behind `bench/peak.py` and the bf16-vs-fp32 precision choice.

Shared so the peak the MFU divides by and the speed-up that picks the compute dtype
(rlkit/utils/cpu_precision.py) come from the same measurement: the best of `repeats`
timed calls after a warm-up (a peak is what the hardware can do; on a shared machine
the best call is the estimate, the median is kept beside it to show the noise).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def best_and_median(fn: Callable[[], object], repeats: int) -> tuple[float, float]:
    """Seconds of the fastest and the median of `repeats` calls of `fn`, after one warm-up call."""
    fn()  # warm-up (oneDNN primitive creation, page faults)
    times = []
    for _ in range(max(1, repeats)):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times), statistics.median(times)


def matmul_gflops(n: int, dtype: torch.dtype, repeats: int, m: int | None = None, k: int | None = None) -> dict:
    """GFLOP/s of an (m x k) @ (k x n) matmul in `dtype` (square n x n x n by default; 2 m k n FLOPs)."""
    m, k = m or n, k or n
    a = torch.randn(m, k).to(dtype)
    b = torch.randn(k, n).to(dtype)
    best, median = best_and_median(lambda: torch.mm(a, b), repeats)
    flops = 2.0 * m * k * n
    row = {"n": n, "gflops": flops / best / 1e9, "gflops_median": flops / median / 1e9}
    if (m, k) != (n, n):
        row.update(m=m, k=k)
    return row
