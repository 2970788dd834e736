"""Loss aggregation: how a (B, R) per-token loss becomes one scalar (`loss_agg_mode`, registry `LOSS_AGG`).

Each mode declares the unit it averages over (`@needs(unit=...)`: tokens, sequences or rows), which is how
micro-batch losses are reweighted so that gradient accumulation gives the mini-batch's loss
(rlkit/workers/micro_batch.py).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlkit.algo.needs import needs, rows, sequences, summed, tokens
from rlkit.algo.utils import masked_mean, masked_sum
from rlkit.registry import Registry

LossAgg = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

#: name -> fn(loss_mat, mask) -> scalar, chosen by `loss_agg_mode` in the config
LOSS_AGG: Registry[LossAgg] = Registry("loss aggregation mode")

def _seq_mean(per_seq: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over rows that have at least one valid token (an empty row is not a sequence)."""
    return masked_mean(per_seq, (mask.sum(dim=-1) > 0).to(per_seq.dtype))


@LOSS_AGG.register("token-mean")
@needs(unit=tokens)
def _token_mean(loss_mat: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Every valid token weighs the same: long answers dominate."""
    return masked_mean(loss_mat, mask)


@LOSS_AGG.register("token-sum")
@needs(unit=summed)
def _token_sum(loss_mat: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """No normaliser: the loss scales with the batch's token count (pair with a small learning rate)."""
    return masked_sum(loss_mat, mask)


@LOSS_AGG.register("seq-mean-token-sum")
@needs(unit=sequences)
def _seq_mean_token_sum(loss_mat: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return _seq_mean(masked_sum(loss_mat, mask, dim=-1), mask)


@LOSS_AGG.register("seq-mean-token-mean")
@needs(unit=sequences)
def _seq_mean_token_mean(loss_mat: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Every sequence weighs the same, whatever its length (original GRPO)."""
    return _seq_mean(masked_mean(loss_mat, mask, dim=-1), mask)


@LOSS_AGG.register("seq-mean-token-sum-norm")
@needs(unit=rows)
def _seq_mean_token_sum_norm(loss_mat: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Dr.GRPO: divide by a constant (B * horizon) so the normaliser never depends on lengths."""
    horizon = mask.shape[-1]
    return (masked_sum(loss_mat, mask, dim=-1) / horizon).mean()


def agg_loss(loss_mat: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean") -> torch.Tensor:
    """Reduce a (B, R) per-token loss to a scalar with the registered `mode`."""
    return LOSS_AGG.get(mode)(loss_mat, mask)
