"""Policy-gradient losses, looked up by `actor_rollout_ref.actor.policy_loss`.

Shared signature:

    fn(old_log_prob, log_prob, advantages, response_mask, *, <LOSS_PARAMS: clip_ratio_low, clip_ratio_high,
       clip_ratio_c, loss_agg_mode, ...>, rollout_is_weights=None, ref_log_prob=None, **_)
    -> {"pg_loss", "pg_clipfrac", "ppo_kl", "pg_clipfrac_lower"}

`pg_loss` carries the gradient; the other entries are detached scalars for logging.
`rollout_is_weights` (B, R), detached, multiply the per-token loss: the rollout correction
(rlkit.algo.rollout_correction: truncated importance weights, 0 for rejected tokens) for the
rollout engine's policy differing from the trainer's. A loss that reads `ref_log_prob`
declares `@needs(ref=True)` under its registration (rlkit.algo.needs), so the reference
model is built for it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from rlkit.algo.loss_agg import agg_loss
from rlkit.algo.utils import masked_mean
from rlkit.registry import Registry

PolicyLoss = Callable[..., dict[str, torch.Tensor]]

#: name -> loss fn; see the module docstring for the shared signature.
POLICY_LOSSES: Registry[PolicyLoss] = Registry("policy loss")

#: the actor config fields (actor_rollout_ref.actor.*) every policy loss is called with, as keywords of the same
#: name; a loss reads those it needs and ignores the rest (`**_`)
LOSS_PARAMS = ("clip_ratio_low", "clip_ratio_high", "clip_ratio_c", "loss_agg_mode", "tau_pos", "tau_neg",
               "clip_cov_ratio", "clip_cov_lb", "clip_cov_ub", "kl_cov_ratio", "ppo_kl_coef", "dro_beta",
               "vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg")

#: bound on log-ratios before exp(), so a stale or diverged sample cannot produce inf.
MAX_LOG_RATIO = 20.0


def clamped_ratio(log_prob: torch.Tensor, old_log_prob: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(log r, r) per token: log pi - log pi_old bounded to +-MAX_LOG_RATIO, and its exp (both carry the gradient;
    a loss that only weighs by r detaches it). Every token-ratio loss starts here, so all bound it the same way."""
    log_ratio = torch.clamp(log_prob - old_log_prob, -MAX_LOG_RATIO, MAX_LOG_RATIO)
    return log_ratio, torch.exp(log_ratio)


def _weighted(loss_mat: torch.Tensor, rollout_is_weights: torch.Tensor | None) -> torch.Tensor:
    return loss_mat if rollout_is_weights is None else loss_mat * rollout_is_weights.detach()


def _clipped_surrogate(
    ratio: torch.Tensor, advantages: torch.Tensor, low: float, high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's pessimistic max(-A r, -A clip(r, 1-low, 1+high)) and where the clip was active."""
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - low, 1.0 + high)
    return torch.maximum(unclipped, clipped), (clipped > unclipped)


@POLICY_LOSSES.register("vanilla", "ppo")
def vanilla(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float | None = 3.0,
    loss_agg_mode: str = "token-mean",
    rollout_is_weights: torch.Tensor | None = None,
    **_: Any,
) -> dict[str, torch.Tensor]:
    """Token-level PPO clip with separate low/high bounds (DAPO clip-higher) and dual-clip.

    Dual-clip: for A < 0 the clipped objective is unbounded as the ratio grows, so
    the loss is capped at -A * c (c > 1); `clip_ratio_c=None` disables it.
    """
    if clip_ratio_c is not None and clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c must be > 1 for dual-clip, got {clip_ratio_c}")
    log_ratio, ratio = clamped_ratio(log_prob, old_log_prob)
    loss, clipped = _clipped_surrogate(ratio, advantages, clip_ratio_low, clip_ratio_high)
    lower = torch.zeros_like(clipped)
    if clip_ratio_c is not None:
        cap = -advantages * clip_ratio_c
        lower = (advantages < 0) & (loss > cap)
        loss = torch.where(advantages < 0, torch.minimum(loss, cap), loss)
    mask = response_mask
    return {
        "pg_loss": agg_loss(_weighted(loss, rollout_is_weights), mask, loss_agg_mode),
        "pg_clipfrac": masked_mean(clipped.float(), mask).detach(),
        "ppo_kl": masked_mean(-log_ratio, mask).detach(),
        "pg_clipfrac_lower": masked_mean(lower.float(), mask).detach(),
    }


@POLICY_LOSSES.register("gspo")
def gspo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float | None = 3.0,
    loss_agg_mode: str = "token-mean",
    rollout_is_weights: torch.Tensor | None = None,
    **_: Any,
) -> dict[str, torch.Tensor]:
    """GSPO: clip the sequence-level ratio s = exp(mean_t log r_t) (geometric mean of token ratios).

    Per token we use log s_i.detach() + log_prob_t - log_prob_t.detach(): its value is
    log s_i, and its gradient is d log_prob_t, so every token of sequence i is scaled
    by the same s_i. GSPO usually pairs with `seq-mean-token-mean` and clip ranges
    around 3e-4 / 4e-4; both come from the config. `clip_ratio_c` is unused.
    """
    mask = response_mask
    log_ratio = log_prob - old_log_prob
    seq_log_ratio = masked_mean(log_ratio, mask, dim=-1, keepdim=True)
    token_log_ratio = seq_log_ratio.detach() + log_prob - log_prob.detach()
    ratio = torch.exp(torch.clamp(token_log_ratio, max=MAX_LOG_RATIO / 2))
    loss, clipped = _clipped_surrogate(ratio, advantages, clip_ratio_low, clip_ratio_high)
    return {
        "pg_loss": agg_loss(_weighted(loss, rollout_is_weights), mask, loss_agg_mode),
        "pg_clipfrac": masked_mean(clipped.float(), mask).detach(),
        "ppo_kl": masked_mean(-log_ratio, mask).detach(),
        "pg_clipfrac_lower": log_prob.new_zeros(()),
    }


@POLICY_LOSSES.register("sapo")
def sapo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    loss_agg_mode: str = "token-mean",
    rollout_is_weights: torch.Tensor | None = None,
    **_: Any,
) -> dict[str, torch.Tensor]:
    """SAPO (arXiv 2511.20347): a soft gate f(r) = 4/tau * sigmoid(tau (r - 1)) instead of the hard clip.

    Loss per token -f(r) A with tau = tau_pos where A > 0, tau_neg elsewhere; f'(1) = 1, so on-policy it is
    the plain policy gradient, and far from r = 1 the gradient fades smoothly instead of dropping to 0.
    Nothing is clipped: `pg_clipfrac` reports the share of tokens whose gate gradient fell below 1/2.
    """
    mask = response_mask
    log_ratio, ratio = clamped_ratio(log_prob, old_log_prob)
    tau = torch.where(advantages > 0, torch.full_like(ratio, tau_pos), torch.full_like(ratio, tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1.0))
    loss = -(4.0 / tau) * gate * advantages
    faded = 4.0 * gate * (1.0 - gate) < 0.5  # the gate's slope, f'(r) = 4 s (1 - s)
    return {
        "pg_loss": agg_loss(_weighted(loss, rollout_is_weights), mask, loss_agg_mode),
        "pg_clipfrac": masked_mean(faded.float(), mask).detach(),
        "ppo_kl": masked_mean(-log_ratio, mask).detach(),
        "pg_clipfrac_lower": log_prob.new_zeros(()),
    }


@POLICY_LOSSES.register("geo_mean", "gmpo")
def geo_mean(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_ratio_low: float = 0.4,
    clip_ratio_high: float = 0.4,
    loss_agg_mode: str = "seq-mean-token-mean",
    rollout_is_weights: torch.Tensor | None = None,
    **_: Any,
) -> dict[str, torch.Tensor]:
    """GMPO (arXiv 2507.20673): maximise the geometric mean of the clipped token objectives of a response.

    Token log-ratios are clipped in log space to [-clip_ratio_low, clip_ratio_high], pessimistically for
    the sign of A; the sequence ratio is exp(mean_t clipped log r_t) and the sequence loss -A_i * ratio_i
    (A_i the response's mean advantage). Every token of a response carries that sequence loss, so
    `seq-mean-token-mean` (the preset's, and the paper's) gives the mean over responses.
    """
    mask = response_mask
    log_ratio, _ = clamped_ratio(log_prob, old_log_prob)
    sign = torch.sign(advantages)
    clipped_lr = torch.clamp(log_ratio, -clip_ratio_low, clip_ratio_high)
    pessimistic = sign * torch.minimum(sign * log_ratio, sign * clipped_lr)
    seq_ratio = torch.exp(masked_mean(pessimistic, mask, dim=-1, keepdim=True))
    seq_adv = masked_mean(advantages, mask, dim=-1, keepdim=True)
    loss = (-seq_adv * seq_ratio).expand_as(log_prob)
    if rollout_is_weights is not None:  # the sequence's geometric-mean weight, as its ratio
        w = rollout_is_weights.detach().clamp_min(1e-10).log()
        loss = loss * torch.exp(masked_mean(w, mask, dim=-1, keepdim=True))
    clipped = (log_ratio != clipped_lr).float()
    return {
        "pg_loss": agg_loss(loss, mask, loss_agg_mode),
        "pg_clipfrac": masked_mean(clipped * (advantages > 0), mask).detach(),
        "ppo_kl": masked_mean(-log_ratio, mask).detach(),
        "pg_clipfrac_lower": masked_mean(clipped * (advantages < 0), mask).detach(),
    }
