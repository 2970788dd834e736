"""The optimal token baseline (OTB, Li et al. 2026, arXiv 2602.07078): a baseline per token position, not per response.

Within one prompt's group, the baseline at step t is the return-to-go G_t averaged over the group's samples
weighted by their realized energy W_t = sum_{j<=t} (1 - 2 pi_j + sum_v pi_v^2), the logit-gradient proxy of
how much score-function variance a sample has accumulated by step t (pi_j: the sampled token's probability):

    B_t = sum_i G_t^i W_t^i / (sum_i W_t^i + eps),    A_t = G_t - B_t

Rollout-correction weights rho, when given, scale each step's energy by rho^2. A group of one has no baseline
(A_t = G_t). `optimal_token_baseline` aligns samples by column; `tir_optimal_token_baseline` (tool-integrated,
multi-turn) aligns them by the t-th *model* token, so tool output spliced into a response does not shift steps.

Both read `sum_pi_squared` from the actor's log-prob forward (`@needs(sum_pi_squared=True)`).
"""

from __future__ import annotations

import torch

from rlkit.algo.advantages import ADV_ESTIMATORS, AdvantageInputs, group_ids
from rlkit.algo.needs import needs
from rlkit.errors import UserError

#: added to the group's summed energy (OTB's epsilon)
EPS = 1e-8


def _energy_and_returns(inputs: AdvantageInputs, who: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(cumulative energy W, return-to-go G), both (B, R), zero-reward and zero-energy on masked tokens."""
    if inputs.old_log_probs is None or inputs.sum_pi_squared is None:
        raise UserError(f"advantage estimator '{who}' needs old_log_probs and sum_pi_squared from the actor's "
                        "log-prob forward: pass both in AdvantageInputs (the actor's compute_log_prob returns "
                        "sum_pi_squared when built with sum_pi_squared=True)")
    mask = inputs.response_mask.to(inputs.token_level_rewards)
    step = 1.0 - 2.0 * torch.exp(inputs.old_log_probs) + inputs.sum_pi_squared
    if inputs.rollout_is_weights is not None:
        step = step * inputs.rollout_is_weights ** 2
    energy = torch.cumsum(step * mask, dim=-1)
    returns = torch.flip(torch.cumsum(torch.flip(inputs.token_level_rewards * mask, [-1]), dim=-1), [-1])
    return energy, returns


def _group_baselines(returns: torch.Tensor, energy: torch.Tensor, mask: torch.Tensor,
                     gid: torch.Tensor) -> torch.Tensor:
    """Per row and column, the energy-weighted group mean of the returns; 0 for a group of one."""
    n_groups = int(gid.max()) + 1 if gid.numel() else 0
    width = returns.shape[-1]
    gid = gid.to(returns.device)
    num = returns.new_zeros(n_groups, width).index_add(0, gid, returns * energy * mask)
    den = returns.new_zeros(n_groups, width).index_add(0, gid, energy * mask)
    size = returns.new_zeros(n_groups).index_add(0, gid, torch.ones_like(gid, dtype=returns.dtype))
    baseline = (num / (den + EPS))[gid]
    return torch.where(size[gid, None] > 1, baseline, torch.zeros_like(baseline))


@ADV_ESTIMATORS.register("optimal_token_baseline")
@needs(groups=True, sum_pi_squared=True)
@torch.no_grad()
def optimal_token_baseline(inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """OTB with the samples of a group aligned by column: A_t = G_t - B_t (see the module docstring)."""
    mask = inputs.response_mask.to(inputs.token_level_rewards)
    energy, returns = _energy_and_returns(inputs, "optimal_token_baseline")
    gid = group_ids(inputs.index, returns.shape[0], "optimal_token_baseline")
    return (returns - _group_baselines(returns, energy, mask, gid)) * mask, returns


@ADV_ESTIMATORS.register("tir_optimal_token_baseline")
@needs(groups=True, sum_pi_squared=True)
@torch.no_grad()
def tir_optimal_token_baseline(inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """OTB with the samples aligned by model-token count: valid tokens are packed left, baselined, put back.

    Rows with no valid token take no part in their group (they neither count towards its size nor get a baseline).
    """
    mask = inputs.response_mask.to(inputs.token_level_rewards)
    energy, returns = _energy_and_returns(inputs, "tir_optimal_token_baseline")
    gid = group_ids(inputs.index, returns.shape[0], "tir_optimal_token_baseline")
    valid = mask > 0
    # stable sort puts each row's valid tokens first, in order: column k of the packed view is its k-th model token
    order = torch.argsort((~valid).to(torch.int8), dim=-1, stable=True)
    packed_mask = torch.gather(mask, -1, order)
    packed_g, packed_w = torch.gather(returns, -1, order), torch.gather(energy, -1, order)
    nonempty = valid.any(dim=-1)
    base = torch.zeros_like(packed_g)
    if nonempty.any():
        rows = nonempty.nonzero(as_tuple=True)[0]
        _, gid_kept = torch.unique(gid[rows.cpu()], return_inverse=True)
        base[rows] = _group_baselines(packed_g[rows], packed_w[rows], packed_mask[rows], gid_kept)
    unpacked = torch.zeros_like(base).scatter(-1, order, base)
    return (returns - unpacked) * mask, returns
