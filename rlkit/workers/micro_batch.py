"""Micro-batching for forward/backward passes: by count, or by a token budget (dynamic batch size).

With FSDP every rank must run the same number of forward/backward passes (each
pass all-gathers parameters), so dynamic micro-batches agree on the count
across ranks and then balance tokens within it.
"""

from __future__ import annotations

import heapq

import torch
import torch.distributed as dist

from rlkit.algo.run_needs import agg_unit
from rlkit.protocol import Batch


def split_by_count(batch: Batch, micro_batch_size: int) -> list[Batch]:
    return batch.split(micro_batch_size)


def _balanced_partitions(lengths: list[int], k: int) -> list[list[int]]:
    """Greedy longest-first into k bins by token count (classic LPT); each bin keeps index order."""
    bins: list[tuple[int, int, list[int]]] = [(0, i, []) for i in range(k)]
    heapq.heapify(bins)
    for idx in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        total, i, members = heapq.heappop(bins)
        members.append(idx)
        heapq.heappush(bins, (total + lengths[idx], i, members))
    return [sorted(m) for _, _, m in sorted(bins, key=lambda b: b[1]) if m]


def split_by_tokens(batch: Batch, max_tokens: int, same_count_across_ranks: bool = True) -> list[Batch]:
    """Micro-batches whose valid-token count stays under `max_tokens` (one long row may exceed it alone)."""
    lengths = batch["attention_mask"].sum(-1).tolist()
    total = sum(lengths)
    k = min(max(1, -(-total // max_tokens)), max(1, len(lengths)))
    if same_count_across_ranks and dist.is_initialized() and dist.get_world_size() > 1:
        t = torch.tensor([k])
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        k = int(t.item())
    # DP shards have equal row counts, so k <= rows on every rank and no bin is empty
    parts = _balanced_partitions(lengths, min(k, len(lengths)))
    return [batch.index(p) for p in parts]


def balance_across_ranks(batch: Batch, world_size: int) -> torch.Tensor:
    """A row order such that an equal DP split gives each rank about the same number of tokens."""
    lengths = batch["attention_mask"].sum(-1).tolist()
    n = len(lengths)
    if world_size <= 1 or n % world_size:
        return torch.arange(n)
    per = n // world_size
    bins: list[list[int]] = [[] for _ in range(world_size)]
    totals = [0] * world_size
    for idx in sorted(range(n), key=lambda i: -lengths[i]):
        open_bins = [b for b in range(world_size) if len(bins[b]) < per]
        b = min(open_bins, key=lambda j: totals[j])
        bins[b].append(idx)
        totals[b] += lengths[idx]
    return torch.tensor([i for b in bins for i in sorted(b)])


def loss_scales(micro_masks: list[torch.Tensor], loss_agg_mode: str) -> list[float]:
    """Weights for micro-batch losses (each aggregated by `loss_agg_mode` over its own rows) so that
    their sum, averaged over data-parallel ranks by FSDP's gradient reduction, equals the loss of
    the whole global mini-batch: weight_i = units_i * world_size / units summed over all ranks.

    Units are what the mode averages over, as the mode declares at its registration
    (`@needs(unit=...)` in rlkit.algo.utils: valid tokens for token-mean, non-empty sequences for the
    seq-mean modes). Normalising by the global count matters when ranks hold different numbers of
    tokens: a per-rank token-mean would overweight the tokens of the rank that has fewer. Every
    rank must call this once per mini-batch (one all_reduce).
    """
    unit = agg_unit(loss_agg_mode)
    counts = torch.tensor([float(unit(m)) for m in micro_masks], dtype=torch.float64)
    total = counts.sum().reshape(1)
    world = 1
    if dist.is_initialized() and dist.get_world_size() > 1:
        world = dist.get_world_size()
        dist.all_reduce(total)
    return (counts * world / total.clamp(min=1.0)).tolist()
