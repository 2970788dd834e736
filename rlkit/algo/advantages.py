"""Advantage estimators, looked up by `algorithm.adv_estimator`.

All share one signature so the trainer passes everything it has and never
branches on the name:

    fn(token_level_rewards, response_mask, *, index=None, values=None, gamma=1.0, lam=1.0,
       norm_adv_by_std=True, epsilon=1e-6, reward_baselines=None, **_) -> (advantages, returns)

`index` is the per-row `uid` (same for the n samples of one prompt). Masked
tokens (padding, tool output) are not time steps: they carry no reward, get a
zero advantage and are skipped by the recursions.

Each estimator declares what it reads beyond rewards and the mask with
`@needs(...)` (rlkit.algo.needs, read with `needs_of(ADV_ESTIMATORS, name)`): the
config checks and the trainer provide exactly that (a critic, n >= 2 samples per
prompt, a greedy baseline) without knowing estimator names.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from rlkit.algo.needs import needs
from rlkit.algo.utils import masked_whiten
from rlkit.errors import UserError
from rlkit.registry import Registry

AdvEstimator = Callable[..., tuple[torch.Tensor, torch.Tensor]]

#: name -> estimator; see the module docstring for the shared signature.
ADV_ESTIMATORS: Registry[AdvEstimator] = Registry("advantage estimator")

Index = np.ndarray | Sequence[Any] | None


# -------------------------------------------------------------------- helpers
def outcome_scores(token_level_rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """One scalar per row: the sum of rewards over valid tokens."""
    return (token_level_rewards * response_mask).sum(dim=-1)


def group_ids(index: Index, n_rows: int, who: str) -> torch.Tensor:
    """Map arbitrary hashable uids to 0..G-1 (first-seen order)."""
    if index is None:
        raise UserError(f"advantage estimator '{who}' groups samples by prompt: pass index= the per-row 'uid' array")
    uids = list(index)
    if len(uids) != n_rows:
        raise ValueError(f"{who}: index has {len(uids)} entries for {n_rows} rows")
    seen: dict[Any, int] = {}
    return torch.tensor([seen.setdefault(u, len(seen)) for u in uids], dtype=torch.long)


def group_stats(scores: torch.Tensor, gid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row (group size, group mean, unbiased group std); std is 0 for a group of one."""
    gid = gid.to(scores.device)
    n_groups = int(gid.max()) + 1 if gid.numel() else 0
    zeros = scores.new_zeros(n_groups)
    count = zeros.index_add(0, gid, torch.ones_like(scores))
    mean = zeros.index_add(0, gid, scores) / count
    sq_dev = zeros.index_add(0, gid, (scores - mean[gid]) ** 2)
    std = torch.sqrt(sq_dev / (count - 1).clamp_min(1.0))
    return count[gid], mean[gid], std[gid]


def discounted_returns(rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """Return-to-go G_t = r_t + gamma * G_{next valid t}; masked positions pass G through and end as 0."""
    running = rewards.new_zeros(rewards.shape[0])
    out = torch.zeros_like(rewards)
    for t in reversed(range(rewards.shape[1])):
        valid = mask[:, t] > 0
        running = torch.where(valid, rewards[:, t] + gamma * running, running)
        out[:, t] = running
    return out * mask


def gae_unwhitened(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE before whitening: (advantages, returns = advantages + values), zero on masked tokens.

    A masked token leaves `next_value` and the running GAE untouched, so a tool
    span between two model turns is transparent to the recursion.
    """
    batch = rewards.shape[0]
    next_value = rewards.new_zeros(batch)
    last_gae = rewards.new_zeros(batch)
    adv = torch.zeros_like(rewards)
    for t in reversed(range(rewards.shape[1])):
        valid = mask[:, t] > 0
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        cur = delta + gamma * lam * last_gae
        next_value = torch.where(valid, values[:, t], next_value)
        last_gae = torch.where(valid, cur, last_gae)
        adv[:, t] = last_gae
    return adv * mask, (adv + values) * mask


def _broadcast(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return scores.unsqueeze(-1) * mask


def _whiten_valid(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return masked_whiten(x, mask) * mask


# ----------------------------------------------------------------- estimators
@ADV_ESTIMATORS.register("gae")
@needs(values=True)
@torch.no_grad()
def gae(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    index: Index = None,
    values: torch.Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    norm_adv_by_std: bool = True,
    epsilon: float = 1e-6,
    reward_baselines: torch.Tensor | None = None,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's GAE(gamma, lam) against critic `values`; advantages whitened over valid tokens."""
    if values is None:
        raise UserError("advantage estimator 'gae' needs critic values: enable the critic or pick grpo/rloo")
    adv, returns = gae_unwhitened(token_level_rewards, values, response_mask, gamma, lam)
    return _whiten_valid(adv, response_mask), returns


@ADV_ESTIMATORS.register("grpo")
@needs(groups=True)
@torch.no_grad()
def grpo(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    index: Index = None,
    values: torch.Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    norm_adv_by_std: bool = True,
    epsilon: float = 1e-6,
    reward_baselines: torch.Tensor | None = None,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Group-relative outcome advantage (r - mean_g) / (std_g + eps); Dr.GRPO when not norm_adv_by_std.

    A group of one has no baseline to compare against, so it gets 0.
    """
    scores = outcome_scores(token_level_rewards, response_mask)
    count, mean, std = group_stats(scores, group_ids(index, scores.shape[0], "grpo"))
    centred = scores - mean
    if norm_adv_by_std:
        centred = centred / (std + epsilon)
    adv = _broadcast(torch.where(count > 1, centred, torch.zeros_like(centred)), response_mask)
    return adv, adv


@ADV_ESTIMATORS.register("rloo")
@needs(groups=True)
@torch.no_grad()
def rloo(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    index: Index = None,
    values: torch.Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    norm_adv_by_std: bool = True,
    epsilon: float = 1e-6,
    reward_baselines: torch.Tensor | None = None,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE leave-one-out: r_i - mean of the other samples = n/(n-1) * (r_i - mean_g)."""
    scores = outcome_scores(token_level_rewards, response_mask)
    count, mean, _std = group_stats(scores, group_ids(index, scores.shape[0], "rloo"))
    loo = count / (count - 1).clamp_min(1.0) * (scores - mean)
    adv = _broadcast(torch.where(count > 1, loo, torch.zeros_like(loo)), response_mask)
    return adv, adv


@ADV_ESTIMATORS.register("reinforce_plus_plus")
@torch.no_grad()
def reinforce_plus_plus(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    index: Index = None,
    values: torch.Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    norm_adv_by_std: bool = True,
    epsilon: float = 1e-6,
    reward_baselines: torch.Tensor | None = None,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++: discounted return-to-go per token, whitened across the batch (no critic, no groups)."""
    returns = discounted_returns(token_level_rewards, response_mask, gamma)
    return _whiten_valid(returns, response_mask), returns


@ADV_ESTIMATORS.register("reinforce_plus_plus_baseline")
@needs(groups=True)
@torch.no_grad()
def reinforce_plus_plus_baseline(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    index: Index = None,
    values: torch.Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    norm_adv_by_std: bool = True,
    epsilon: float = 1e-6,
    reward_baselines: torch.Tensor | None = None,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ with a group-mean baseline on the outcome, then batch whitening over valid tokens."""
    scores = outcome_scores(token_level_rewards, response_mask)
    _count, mean, _std = group_stats(scores, group_ids(index, scores.shape[0], "reinforce_plus_plus_baseline"))
    adv = _whiten_valid(_broadcast(scores - mean, response_mask), response_mask)
    return adv, adv


@ADV_ESTIMATORS.register("remax")
@needs(greedy_baseline=True)
@torch.no_grad()
def remax(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    index: Index = None,
    values: torch.Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    norm_adv_by_std: bool = True,
    epsilon: float = 1e-6,
    reward_baselines: torch.Tensor | None = None,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax: return-to-go minus the reward of a greedy response to the same prompt (`reward_baselines`, (B,)).

    The greedy response is the policy's own "typical" answer, so the baseline costs one extra
    generation per prompt instead of a critic, and works with one sample per prompt. The trainer
    generates and scores it because this estimator declares `@needs(greedy_baseline=True)`.
    """
    if reward_baselines is None:
        raise UserError("advantage estimator 'remax' needs reward_baselines: the greedy sample's reward per row")
    returns = discounted_returns(token_level_rewards, response_mask, gamma)
    if reward_baselines.numel() != returns.shape[0]:
        raise ValueError(f"remax: {reward_baselines.numel()} reward_baselines for {returns.shape[0]} rows")
    baseline = reward_baselines.to(returns).reshape(-1, 1)
    return (returns - baseline) * response_mask, returns
