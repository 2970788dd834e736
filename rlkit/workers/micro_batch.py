"""Micro-batching for forward/backward passes: by count, or by a token budget (dynamic batch size).

With FSDP every rank must run the same number of forward/backward passes (each
pass all-gathers parameters), so dynamic micro-batches agree on the count
across ranks and then balance tokens within it. A token budget regroups rows, so a forward-only
pass (log-probs, values) puts its outputs back in the batch's row order (`MicroBatching.split`
returns the order, `in_row_order` undoes it); an update needs no order: `loss_scales` weighs each
micro-batch by what it holds, so the mini-batch loss does not depend on the grouping.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import torch
import torch.distributed as dist

from rlkit.algo.needs import summed
from rlkit.algo.run_needs import agg_unit
from rlkit.controller.worker import collective_device
from rlkit.protocol import Batch


def _balanced_partitions(lengths: list[int], k: int) -> list[list[int]]:
    """Greedy longest-first into k bins by token count (classic LPT); each bin keeps index order."""
    bins: list[tuple[int, int, list[int]]] = [(0, i, []) for i in range(k)]
    heapq.heapify(bins)
    for idx in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        total, i, members = heapq.heappop(bins)
        members.append(idx)
        heapq.heappush(bins, (total + lengths[idx], i, members))
    return [sorted(m) for _, _, m in sorted(bins, key=lambda b: b[1]) if m]


def token_partitions(batch: Batch, max_tokens: int) -> list[list[int]]:
    """Row indices of micro-batches of about `max_tokens` valid tokens each: as many as the tokens need
    (at most one per row; the most any rank needs, so every rank runs as many forwards), balanced by
    tokens (one long row may exceed the budget alone, and balancing may overshoot it a little)."""
    lengths = batch["attention_mask"].sum(-1).tolist()
    total = sum(lengths)
    k = min(max(1, -(-total // max_tokens)), max(1, len(lengths)))
    if dist.is_initialized() and dist.get_world_size() > 1:
        t = torch.tensor([k], device=collective_device())
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        k = int(t.item())
    # DP shards have equal row counts, so k <= rows on every rank and no bin is empty
    return _balanced_partitions(lengths, min(k, len(lengths)))


@dataclass(frozen=True)
class MicroBatching:
    """How one pass cuts this rank's rows into forward calls: `rows` per call, or, with `use_dynamic_bsz`,
    groups of about `max_token_len` valid tokens (verl's `*_use_dynamic_bsz` / `*_max_token_len_per_gpu`)."""

    rows: int
    use_dynamic_bsz: bool = False
    max_token_len: int = 0

    def split(self, batch: Batch) -> tuple[list[Batch], torch.Tensor | None]:
        """The micro-batches, and the batch rows they hold in order (None: the rows kept their order)."""
        if not self.use_dynamic_bsz:
            return batch.split(self.rows), None
        parts = token_partitions(batch, self.max_token_len)
        return [batch.index(p) for p in parts], torch.tensor([i for p in parts for i in p])

    def micro_batches(self, batch: Batch) -> list[Batch]:
        """The micro-batches of an update (their order does not matter to the summed loss)."""
        return self.split(batch)[0]


def in_row_order(outputs: list[torch.Tensor], order: torch.Tensor | None) -> torch.Tensor:
    """The micro-batches' outputs (dim 0 = their rows) concatenated back into the batch's row order."""
    joined = torch.cat(outputs)
    if order is None:
        return joined
    out = torch.empty_like(joined)
    out[order] = joined
    return out


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
    world = dist.get_world_size() if dist.is_initialized() else 1
    if unit is summed:  # a sum over the global mini-batch: each micro-batch's sum counts once (x ranks: FSDP averages)
        return [float(world)] * len(micro_masks)
    counts = torch.tensor([float(unit(m)) for m in micro_masks], dtype=torch.float64)
    total = counts.sum().reshape(1)
    if world > 1:
        total = total.to(collective_device())
        dist.all_reduce(total)
    return (counts * world / total.cpu().clamp(min=1.0)).tolist()
