"""Policy losses of the REINFORCE form -w * A * log pi, with a detached per-token weight w (POLICY_LOSSES).

Unlike the PPO surrogate (rlkit.algo.policy_loss), the ratio r = pi / pi_old is not differentiated: it enters
only as a stopped-gradient weight, truncated or masked, so a token whose ratio left the trust region keeps
(CISPO) or loses (DPPO) its gradient by rule rather than by where a clip happens to be flat.
The shared signature and return keys are those of rlkit.algo.policy_loss.
"""

from __future__ import annotations

from typing import Any

import torch

from rlkit.algo.loss_agg import agg_loss
from rlkit.algo.policy_loss import MAX_LOG_RATIO, POLICY_LOSSES, _weighted, clamped_ratio
from rlkit.algo.utils import masked_mean
from rlkit.errors import UserError


def _result(loss: torch.Tensor, mask: torch.Tensor, mode: str, log_ratio: torch.Tensor,
            clipfrac: torch.Tensor | None = None,
            clipfrac_lower: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    zero = loss.new_zeros(())
    return {
        "pg_loss": agg_loss(loss, mask, mode),
        "pg_clipfrac": zero if clipfrac is None else masked_mean(clipfrac.float(), mask).detach(),
        "ppo_kl": masked_mean(-log_ratio, mask).detach(),
        "pg_clipfrac_lower": zero if clipfrac_lower is None else masked_mean(clipfrac_lower.float(), mask).detach(),
    }


@POLICY_LOSSES.register("gpg")
def gpg(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    loss_agg_mode: str = "token-mean",
    rollout_is_weights: torch.Tensor | None = None,
    **_: Any,
) -> dict[str, torch.Tensor]:
    """GPG (arXiv 2504.02546): the plain policy gradient -A log pi, no ratio, no clip (pair with the gpg estimator)."""
    log_ratio, _ = clamped_ratio(log_prob.detach(), old_log_prob)
    loss = _weighted(-advantages * log_prob, rollout_is_weights)
    return _result(loss, response_mask, loss_agg_mode, log_ratio)


@POLICY_LOSSES.register("cispo")
def cispo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    loss_agg_mode: str = "token-mean",
    rollout_is_weights: torch.Tensor | None = None,
    **_: Any,
) -> dict[str, torch.Tensor]:
    """CISPO (MiniMax-M1, arXiv 2506.13585): -sg(clip(r, 1 - low, 1 + high)) * A * log pi.

    The importance weight is truncated, never the token: every token keeps a gradient. The paper sets no
    lower bound (the `cispo` preset: clip_ratio_low=1.0) and tunes only the upper one.
    `pg_clipfrac`: tokens whose weight was truncated from above; `pg_clipfrac_lower`: from below.
    """
    log_ratio, ratio = clamped_ratio(log_prob.detach(), old_log_prob)
    weight = torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    loss = _weighted(-weight * advantages * log_prob, rollout_is_weights)
    return _result(loss, response_mask, loss_agg_mode, log_ratio,
                   ratio > 1.0 + clip_ratio_high, ratio < 1.0 - clip_ratio_low)


#: floor of VESPO's sequence log-weight (w >= 1e-8), so the kernel's w^k stays finite
VESPO_MIN_LOG_W = -18.420680743952367  # log(1e-8)


@POLICY_LOSSES.register("vespo")
def vespo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    vespo_k_pos: float = 2.0,
    vespo_lambda_pos: float = 3.0,
    vespo_k_neg: float = 3.0,
    vespo_lambda_neg: float = 2.0,
    loss_agg_mode: str = "token-mean",
    rollout_is_weights: torch.Tensor | None = None,
    **_: Any,
) -> dict[str, torch.Tensor]:
    """VESPO (arXiv 2602.10693): -sg(phi(w)) * A * log pi with w the response's whole-sequence ratio.

    w = prod_t r_t (no length normalisation: the product of the token ratios, log clamped to [log 1e-8, 20]) and
    phi(w) = w^k exp(lambda (1 - w)), a gamma-shaped kernel with phi(1) = 1 that fades both stale directions;
    (k, lambda) = vespo_k_pos / vespo_lambda_pos where the advantage is >= 0, vespo_k_neg / vespo_lambda_neg
    below. `pg_clipfrac`: share of tokens whose weight phi < 1 (faded).
    """
    mask = response_mask
    log_ratio, _ = clamped_ratio(log_prob.detach(), old_log_prob)
    log_w = torch.clamp((log_ratio * mask).sum(-1, keepdim=True), VESPO_MIN_LOG_W, MAX_LOG_RATIO)
    nonneg = advantages >= 0
    k = torch.where(nonneg, vespo_k_pos, vespo_k_neg).to(log_w)
    lam = torch.where(nonneg, vespo_lambda_pos, vespo_lambda_neg).to(log_w)
    phi = torch.exp(k * log_w + lam * (1.0 - torch.exp(log_w)))
    loss = _weighted(-phi * advantages * log_prob, rollout_is_weights)
    return _result(loss, mask, loss_agg_mode, log_ratio, phi < 1.0)


def _dppo(old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
          response_mask: torch.Tensor, inside: torch.Tensor, clip_ratio_c: float | None, loss_agg_mode: str,
          rollout_is_weights: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """DPPO's loss given the tokens `inside` the trust region: -sg(min(r, c)) * A * log pi on them, 0 elsewhere."""
    log_ratio, ratio = clamped_ratio(log_prob.detach(), old_log_prob)
    cap = float("inf") if clip_ratio_c is None else clip_ratio_c
    weight = torch.clamp(ratio, max=cap) * inside.float()
    loss = _weighted(-weight * advantages * log_prob, rollout_is_weights)
    return _result(loss, response_mask, loss_agg_mode, log_ratio, ~inside, inside & (ratio > cap))


@POLICY_LOSSES.register("dppo_tv")
def dppo_tv(
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
    """DPPO-Binary-TV (arXiv 2602.04879): the trust region is on the probability, not the ratio.

    With p, p_old the current and old probability of the sampled token, a token keeps its gradient unless
    the update would push it further out: A > 0 and p - p_old > clip_ratio_high, or A < 0 and
    p_old - p > clip_ratio_low (here the clip keys are total-variation thresholds). Kept tokens are
    weighted by the truncated ratio min(r, clip_ratio_c). `pg_clipfrac`: tokens masked out;
    `pg_clipfrac_lower`: kept tokens whose weight was truncated.
    """
    p, p_old = torch.exp(log_prob.detach()), torch.exp(old_log_prob)
    inside = torch.where(advantages > 0, p - p_old <= clip_ratio_high, p_old - p <= clip_ratio_low)
    return _dppo(old_log_prob, log_prob, advantages, response_mask, inside, clip_ratio_c, loss_agg_mode,
                 rollout_is_weights)


@POLICY_LOSSES.register("dppo_kl")
def dppo_kl(
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
    """DPPO-Binary-KL (arXiv 2602.04879): as dppo_tv with the binary KL of (p_old, 1 - p_old) to (p, 1 - p).

    A token is masked when that KL exceeds clip_ratio_high (A > 0, p rising) or clip_ratio_low (A < 0,
    p falling); a token moving back toward p_old always keeps its gradient.
    """
    lp, old = log_prob.detach(), old_log_prob
    p, p_old = torch.exp(lp), torch.exp(old)
    binary_kl = p_old * (old - lp) + (1 - p_old) * (torch.log1p(-p_old.clamp(max=1 - 1e-7))
                                                   - torch.log1p(-p.clamp(max=1 - 1e-7)))
    inside = torch.where(advantages > 0, (binary_kl <= clip_ratio_high) | (p <= p_old),
                         (binary_kl <= clip_ratio_low) | (p >= p_old))
    return _dppo(old_log_prob, log_prob, advantages, response_mask, inside, clip_ratio_c, loss_agg_mode,
                 rollout_is_weights)


@POLICY_LOSSES.register("dro")
def dro(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    dro_beta: float | None = None,
    loss_agg_mode: str = "token-mean",
    rollout_is_weights: torch.Tensor | None = None,
    **_: Any,
) -> dict[str, torch.Tensor]:
    """DRO as verl's `dro` loss: -(A log pi - beta/2 (log pi - log pi_old)^2), a quadratic pull toward pi_old.

    verl's single-sample form of the quadratic regulariser of Direct Reward Optimisation (arXiv 2405.19107),
    without the paper's learned value baseline (the advantage estimator supplies the baseline).
    """
    if dro_beta is None:
        raise UserError("actor_rollout_ref.actor.policy_loss=dro needs its penalty weight: set "
                        "actor_rollout_ref.actor.policy_loss.dro_beta (e.g. 0.1)")
    log_ratio = log_prob - old_log_prob  # unbounded in the penalty (its gradient is linear in it)
    loss = _weighted(-(advantages * log_prob - 0.5 * dro_beta * log_ratio**2), rollout_is_weights)
    return _result(loss, response_mask, loss_agg_mode, clamped_ratio(log_prob.detach(), old_log_prob)[0])
