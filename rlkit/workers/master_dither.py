"""Dither fp32 master weights that sit exactly on the 16-bit compute grid, so small updates reach the forward.

With bf16 (or fp16) compute the forward sees `round(master)`, and that view changes only when a master
crosses the midpoint to a neighbouring grid value. A checkpoint stored in bf16 (most are) puts every
master exactly on a grid point, the farthest place from both midpoints: an update must accumulate half a
grid step (for |w| = 0.05 in bf16, 1.2e-4: twelve Adam steps at lr 1e-5, all the same sign) before the
policy the trainer scores and the engine samples moves at all. Measured on SmolLM2-135M (bench/bf16_signal.py):
six steps at lr 1e-5 improve the surrogate 10x less in bf16 than in fp32 although the fp32 masters moved.

The fix moves each such master to a uniformly random point inside its rounding cell (strictly between the
two midpoints). `round(master)` is unchanged, so the model computes exactly as loaded, but from then on a
master update `d` changes the view by one grid step with probability |d| / step: the view's expected
change equals the master's (unbiased, like stochastic rounding, with the randomness drawn once). Masters
not on the grid (an fp32 checkpoint) and zeros (bf16 represents tiny values, no dead zone) are left alone.
The random draw is seeded, identical on every rank (it runs before sharding).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

#: the 16-bit compute dtypes whose grid a float32 master can sit on (both are viewed as int16 bit patterns)
GRID_DTYPES = (torch.bfloat16, torch.float16)


def _neighbours(grid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The next grid values below and above |grid| (as float32), from the bit pattern of the magnitude."""
    bits = grid.abs().view(torch.int16)
    below = (bits - 1).view(grid.dtype).float()
    above = (bits + 1).view(grid.dtype).float()
    return below, above


#: elements dithered at a time: the temporaries stay ~100 MB even for a 7B model's embedding
CHUNK = 1 << 22


@torch.no_grad()
def dither_tensor(master: torch.Tensor, compute_dtype: torch.dtype, generator: torch.Generator) -> int:
    """Dither `master` (float32) in place where it equals its `compute_dtype` rounding; returns how many moved."""
    if not master.is_contiguous():
        return _dither_flat(master, compute_dtype, generator)
    flat = master.view(-1)
    return sum(_dither_flat(flat[i : i + CHUNK], compute_dtype, generator) for i in range(0, flat.numel(), CHUNK))


def _dither_flat(master: torch.Tensor, compute_dtype: torch.dtype, generator: torch.Generator) -> int:
    grid = master.to(compute_dtype)
    value = grid.float()
    on_grid = (value == master) & (value != 0) & torch.isfinite(value)
    if not bool(on_grid.any()):
        return 0
    below, above = _neighbours(grid)
    magnitude = value.abs()
    low = (magnitude + below) / 2  # the rounding cell of |value| is (low, high)
    high = (magnitude + above) / 2
    u = torch.rand(master.shape, generator=generator, dtype=torch.float32)
    u = u.clamp(1e-3, 1 - 1e-3)  # never onto a midpoint (round-to-even could tip it over)
    dithered = (low + u * (high - low)) * torch.sign(value)
    keep = on_grid & torch.isfinite(dithered) & (dithered.to(compute_dtype).float() == value) & (dithered != master)
    master.copy_(torch.where(keep, dithered, master))
    return int(keep.sum())


def dither_masters(params: Iterable[torch.nn.Parameter], compute_dtype: torch.dtype, seed: int = 0) -> float:
    """Dither every float32 trainable parameter for `compute_dtype`; returns the fraction of elements moved."""
    if compute_dtype not in GRID_DTYPES:
        return 0.0
    generator = torch.Generator().manual_seed(seed)
    moved = total = 0
    for p in params:
        if p.dtype != torch.float32 or not p.requires_grad:
            continue
        moved += dither_tensor(p.data, compute_dtype, generator)
        total += p.numel()
    return moved / total if total else 0.0
