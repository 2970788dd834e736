"""Critic loss: squared error to the returns with PPO-style value clipping."""

from __future__ import annotations

import torch

from rlkit.algo.loss_agg import agg_loss
from rlkit.algo.utils import masked_mean


def compute_value_loss(
    vpreds: torch.Tensor,
    values: torch.Tensor,
    returns: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float | None,
    loss_agg_mode: str = "token-mean",
) -> tuple[torch.Tensor, torch.Tensor]:
    """0.5 * max((v - R)^2, (v_clip - R)^2), v_clip = values + clip(v - values, +-cliprange_value).

    Taking the max keeps the critic from exploiting a large step away from the
    rollout-time `values`. Returns (loss, clipfrac); `cliprange_value=None` disables clipping.
    """
    unclipped = (vpreds - returns).square()
    if cliprange_value is None:
        clipped = unclipped
    else:
        vclipped = values + torch.clamp(vpreds - values, -cliprange_value, cliprange_value)
        clipped = (vclipped - returns).square()
    loss = agg_loss(0.5 * torch.maximum(unclipped, clipped), response_mask, loss_agg_mode)
    clipfrac = masked_mean((clipped > unclipped).float(), response_mask).detach()
    return loss, clipfrac
