"""Log-probs, entropy and sum_v pi_v^2 from logits sharded on the vocabulary over a tensor-parallel group.

A vocabulary-parallel LM head (rlkit/workers/tp_plans.py) leaves each rank the logits of its vocabulary slice,
(K, V/tp). The statistics need sums over the whole vocabulary; they are built from per-rank partial sums, so no
rank ever holds a (K, V) tensor:
- lse = m + log sum_v exp(z_v - m), with m the group's max (an all-reduce of the rows' local maxima, then of
  the local sums);
- z[label] from the rank whose slice holds the label (the others add 0);
- E = sum_v p_v z_v and sum_v p_v^2 from local sums, so entropy = lse - E.
Each reduces (K,) floats, three all-reduces per call at most. The backward needs none: with the same upstream
gradient on every rank of the group (rlkit/workers/tensor_parallel.py `own_rows`), the gradient of the local
logits is local: g_lp (onehot - p) - g_H p (z - E). Rows are processed `chunk_size` at a time in float32, as the
plain head does, so a float32 copy of the local logits never exists whole.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from rlkit.workers.fused_lm_head import HeadStats


def _chunks(rows: int, chunk_size: int) -> list[slice]:
    step = chunk_size if chunk_size and chunk_size > 0 else max(rows, 1)
    return [slice(i, min(i + step, rows)) for i in range(0, rows, step)]


class _VocabParallelStats(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        logits: torch.Tensor,
        labels: torch.Tensor,
        start: int,
        group: Any,
        chunk_size: int,
        with_entropy: bool,
        with_sum_pi_squared: bool,
    ):
        rows, width = logits.shape
        chunks = _chunks(rows, chunk_size)
        local = (labels >= start) & (labels < start + width)
        at = (labels - start).clamp(0, max(width - 1, 0)).long()
        peak = torch.empty(rows, dtype=torch.float32, device=logits.device)
        for sl in chunks:
            peak[sl] = logits[sl].float().amax(-1) if width else float("-inf")
        dist.all_reduce(peak, op=dist.ReduceOp.MAX, group=group)
        sums = torch.zeros(2, rows, dtype=torch.float32, device=logits.device)  # sum exp(z - m), z[label]
        for sl in chunks:
            z = logits[sl].float()
            sums[0, sl] = (z - peak[sl, None]).exp().sum(-1)
            sums[1, sl] = torch.where(local[sl], z.gather(-1, at[sl, None]).squeeze(-1), 0.0) if width else 0.0
        dist.all_reduce(sums, group=group)
        lse = peak + sums[0].log()
        log_probs = sums[1] - lse
        moments = torch.zeros(2, rows, dtype=torch.float32, device=logits.device)  # E = sum p z, sum p^2
        if with_entropy or with_sum_pi_squared:
            for sl in chunks:
                z = logits[sl].float()
                p = (z - lse[sl, None]).exp()
                moments[0, sl] = (p * z).sum(-1)
                moments[1, sl] = p.square().sum(-1)
            dist.all_reduce(moments, group=group)
        mean_z, sum_p2 = moments[0].clone(), moments[1].clone()
        entropy = lse - mean_z
        ctx.save_for_backward(logits, at, local, lse, mean_z)
        ctx.chunks, ctx.with_entropy = chunks, with_entropy
        ctx.mark_non_differentiable(sum_p2)
        if not with_entropy:
            ctx.mark_non_differentiable(entropy)
        return log_probs, entropy, sum_p2

    @staticmethod
    def backward(ctx: Any, grad_lp: torch.Tensor | None, grad_ent: torch.Tensor | None, _grad_p2: Any = None):
        logits, at, local, lse, mean_z = ctx.saved_tensors
        grad = torch.empty_like(logits)
        use_ent = ctx.with_entropy and grad_ent is not None
        if grad_lp is None:
            grad_lp = torch.zeros_like(lse)
        for sl in ctx.chunks:
            z = logits[sl].float()
            p = (z - lse[sl, None]).exp()
            g = -p * grad_lp[sl, None]
            if use_ent:
                g = g - grad_ent[sl, None] * p * (z - mean_z[sl, None])
            g.scatter_add_(-1, at[sl, None], (grad_lp[sl] * local[sl])[:, None])
            grad[sl] = g.to(logits.dtype)
        return grad, None, None, None, None, None, None


def vocab_parallel_stats(
    logits: torch.Tensor,
    labels: torch.Tensor,
    start: int,
    group: Any,
    chunk_size: int,
    with_entropy: bool,
    with_sum_pi_squared: bool,
) -> HeadStats:
    """(K,) float32 log p(label) and, if asked, entropy and sum_v pi_v^2, from this rank's (K, V/tp) logits
    (vocabulary ids [start, start + V/tp)); every rank of `group` calls it with the same rows and labels."""
    lp, ent, p2 = _VocabParallelStats.apply(
        logits, labels.long(), start, group, int(chunk_size or 0), bool(with_entropy), bool(with_sum_pi_squared)
    )
    return HeadStats(lp, ent if with_entropy else None, p2 if with_sum_pi_squared else None)
