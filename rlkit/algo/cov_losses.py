"""Clip-Cov and KL-Cov (arXiv 2505.22617, "The Entropy Mechanism of RL for Reasoning LMs"), in POLICY_LOSSES.

Entropy collapses because the tokens whose log-probability covaries most with their advantage take the
largest steps. Both losses pick such tokens by the centred product cov_t = (A_t - mean A) (log pi_t - mean
log pi) over the valid tokens of the micro-batch the loss sees, and restrain only them: Clip-Cov drops
their gradient, KL-Cov adds a |log r| penalty. As in verl, "the batch" is the micro-batch, so the selected
set (and the loss) depends on how rows are split into micro-batches.
The shared signature and return keys are those of rlkit.algo.policy_loss; `pg_clipfrac` is the share of
valid tokens selected.
"""

from __future__ import annotations

from typing import Any

import torch

from rlkit.algo.loss_agg import agg_loss
from rlkit.algo.policy_loss import POLICY_LOSSES, _clipped_surrogate, _weighted, clamped_ratio
from rlkit.algo.utils import masked_mean


def token_covariance(advantages: torch.Tensor, log_prob: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(A - mean A)(log pi - mean log pi) per token, means over valid tokens; detached."""
    lp = log_prob.detach()
    return (advantages - masked_mean(advantages, mask)) * (lp - masked_mean(lp, mask))


def selection_count(ratio: float, mask: torch.Tensor) -> int:
    """How many tokens a covariance ratio selects: ratio x valid tokens, at least one."""
    return max(int(ratio * float(mask.sum())), 1)


@POLICY_LOSSES.register("clip_cov")
def clip_cov(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_cov_ratio: float = 0.0002,
    clip_cov_lb: float = 1.0,
    clip_cov_ub: float = 5.0,
    loss_agg_mode: str = "token-mean",
    rollout_is_weights: torch.Tensor | None = None,
    **_: Any,
) -> dict[str, torch.Tensor]:
    """Clip-Cov: PPO clip, plus clip_cov_ratio x N tokens drawn at random among the unclipped valid tokens with
    clip_cov_lb < cov < clip_cov_ub get no gradient (their loss term is 0). Drawn with torch's global RNG."""
    mask = response_mask
    log_ratio, ratio = clamped_ratio(log_prob, old_log_prob)
    loss, clipped = _clipped_surrogate(ratio, advantages, clip_ratio_low, clip_ratio_high)
    cov = token_covariance(advantages, log_prob, mask)
    candidates = (mask > 0) & ~clipped & (cov > clip_cov_lb) & (cov < clip_cov_ub)
    where = torch.nonzero(candidates)
    picked = where[torch.randperm(len(where))[: selection_count(clip_cov_ratio, mask)].to(where.device)]
    selected = torch.zeros_like(candidates)
    selected[picked[:, 0], picked[:, 1]] = True
    loss = loss * (~selected).to(loss.dtype)
    return {
        "pg_loss": agg_loss(_weighted(loss, rollout_is_weights), mask, loss_agg_mode),
        "pg_clipfrac": masked_mean(selected.float(), mask).detach(),
        "ppo_kl": masked_mean(-log_ratio, mask).detach(),
        "pg_clipfrac_lower": log_prob.new_zeros(()),
    }


@POLICY_LOSSES.register("kl_cov")
def kl_cov(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    kl_cov_ratio: float = 0.0002,
    ppo_kl_coef: float = 0.1,
    loss_agg_mode: str = "token-mean",
    rollout_is_weights: torch.Tensor | None = None,
    **_: Any,
) -> dict[str, torch.Tensor]:
    """KL-Cov: the unclipped surrogate -A r, plus ppo_kl_coef * |log r| on the kl_cov_ratio x N valid tokens of
    largest covariance."""
    mask = response_mask
    log_ratio, ratio = clamped_ratio(log_prob, old_log_prob)
    loss = -advantages * ratio
    cov = token_covariance(advantages, log_prob, mask).masked_fill(mask <= 0, float("-inf"))
    k = min(selection_count(kl_cov_ratio, mask), int((mask > 0).sum()))
    selected = torch.zeros(cov.numel(), dtype=torch.bool, device=cov.device)
    selected[torch.topk(cov.flatten(), k).indices] = True
    selected = selected.view_as(cov)
    loss = loss + ppo_kl_coef * log_ratio.abs() * selected.to(loss.dtype)
    return {
        "pg_loss": agg_loss(_weighted(loss, rollout_is_weights), mask, loss_agg_mode),
        "pg_clipfrac": masked_mean(selected.float(), mask).detach(),
        "ppo_kl": masked_mean(-log_ratio, mask).detach(),
        "pg_clipfrac_lower": log_prob.new_zeros(()),
    }
