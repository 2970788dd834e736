"""Masked reductions and memory-bounded log-prob/entropy helpers (loss aggregation: rlkit/algo/loss_agg.py).

Every tensor over response tokens is (B, R) with a {0,1} `mask`; padding and
tool/user tokens carry mask 0 and must not move any statistic or gradient.
"""

from __future__ import annotations

import torch

DEFAULT_CHUNK_SIZE = 2048


# ----------------------------------------------------------------- reductions
def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None, keepdim: bool = False) -> torch.Tensor:
    """Sum of `x` over tokens where mask is 1 (all dims when `dim` is None)."""
    prod = x * mask
    return prod.sum() if dim is None else prod.sum(dim=dim, keepdim=keepdim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None, keepdim: bool = False) -> torch.Tensor:
    """Mean over valid tokens; 0 (not NaN) where nothing is valid, so empty rows stay harmless."""
    total = masked_sum(x, mask, dim, keepdim)
    count = mask.sum() if dim is None else mask.sum(dim=dim, keepdim=keepdim)
    return total / count.to(total.dtype).clamp_min(1e-8)


def masked_var(
    x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True, dim: int | None = None, keepdim: bool = False
) -> torch.Tensor:
    """Variance over valid tokens; `unbiased` applies n/(n-1) (skipped when n <= 1, where it is undefined)."""
    mean = masked_mean(x, mask, dim, keepdim=True)
    var = masked_mean((x - mean) ** 2, mask, dim, keepdim)
    if unbiased:
        n = mask.sum() if dim is None else mask.sum(dim=dim, keepdim=keepdim)
        n = n.to(var.dtype)
        var = torch.where(n > 1, var * n / (n - 1).clamp_min(1.0), var)
    return var


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / std over valid tokens of the whole tensor. Masked positions are not zeroed."""
    mean = masked_mean(x, mask)
    var = masked_var(x, mask, unbiased=True)
    out = (x - mean) * torch.rsqrt(var + eps)
    return out if shift_mean else out + mean



# ------------------------------------------------------ log-probs and entropy
def _chunks(n: int, chunk_size: int | None) -> list[slice]:
    if chunk_size is None or chunk_size <= 0 or chunk_size >= n:
        return [slice(0, n)]
    return [slice(i, min(i + chunk_size, n)) for i in range(0, n, chunk_size)]


def entropy_from_logits(logits: torch.Tensor, chunk_size: int | None = DEFAULT_CHUNK_SIZE) -> torch.Tensor:
    """Entropy of softmax(logits) over the last dim, H = logsumexp(z) - sum(p * z).

    Rows are processed `chunk_size` at a time in fp32, so the fp32 softmax never exists for
    the whole (tokens x vocab) batch at once. Returns fp32 with the leading shape of `logits`.
    """
    lead, vocab = logits.shape[:-1], logits.shape[-1]
    flat = logits.reshape(-1, vocab)
    out = []
    for sl in _chunks(flat.shape[0], chunk_size):
        z = flat[sl].float()
        lse = torch.logsumexp(z, dim=-1)
        p = torch.softmax(z, dim=-1)
        out.append(lse - (p * z).sum(dim=-1))
    return torch.cat(out).reshape(lead)


def sum_pi_squared_from_logits(logits: torch.Tensor, chunk_size: int | None = DEFAULT_CHUNK_SIZE) -> torch.Tensor:
    """sum_v softmax(logits)_v^2 over the last dim (the optimal token baseline's energy term), chunked over rows in
    fp32 as `entropy_from_logits`. Returns fp32 with the leading shape of `logits`."""
    lead, vocab = logits.shape[:-1], logits.shape[-1]
    flat = logits.reshape(-1, vocab)
    out = [torch.softmax(flat[sl].float(), dim=-1).square().sum(dim=-1) for sl in _chunks(flat.shape[0], chunk_size)]
    return torch.cat(out).reshape(lead)


def logprobs_from_logits(
    logits: torch.Tensor, labels: torch.Tensor, chunk_size: int | None = DEFAULT_CHUNK_SIZE
) -> torch.Tensor:
    """log softmax(logits)[label] = z[label] - logsumexp(z), chunked over rows, fp32 result.

    Gathering before normalising avoids materialising a full fp32 log_softmax of the batch.
    """
    lead, vocab = logits.shape[:-1], logits.shape[-1]
    if labels.shape != lead:
        raise ValueError(f"logprobs_from_logits: labels {tuple(labels.shape)} do not match logits {tuple(lead)}")
    flat, flat_labels = logits.reshape(-1, vocab), labels.reshape(-1, 1).long()
    out = []
    for sl in _chunks(flat.shape[0], chunk_size):
        z = flat[sl].float()
        picked = z.gather(-1, flat_labels[sl]).squeeze(-1)
        out.append(picked - torch.logsumexp(z, dim=-1))
    return torch.cat(out).reshape(lead)
