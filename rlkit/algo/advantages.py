"""Advantage estimators, looked up by `algorithm.adv_estimator`.

All share one signature so the trainer passes everything it has and never
branches on the name:

    fn(inputs: AdvantageInputs) -> (advantages, returns)   # both (B, R)

`AdvantageInputs` holds the rewards, the mask and every optional input (its fields say
their shapes); an estimator reads the fields it needs. Masked tokens (padding, tool
output) are not time steps: they carry no reward, get a zero advantage and are skipped
by the recursions.

Each estimator declares what it reads beyond rewards and the mask with
`@needs(...)` (rlkit.algo.needs, read with `needs_of(ADV_ESTIMATORS, name)`): the
config checks and the trainer provide exactly that (a critic, n >= 2 samples per
prompt, a greedy baseline) without knowing estimator names.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass
from typing import Any

import numpy as np
import torch

from rlkit.algo.needs import needs
from rlkit.algo.utils import masked_whiten
from rlkit.errors import UserError
from rlkit.registry import Registry

Index = np.ndarray | Sequence[Any] | None


@dataclass(frozen=True)
class AdvantageInputs:
    """What an advantage estimator may read (B rows, R response tokens). The trainer fills in all it has;
    the optional fields an estimator relies on are declared with `@needs` under its registration."""

    token_level_rewards: torch.Tensor  # (B, R) float: per-token rewards (the score on the last valid token, KL...)
    response_mask: torch.Tensor  # (B, R) 1 on the valid response tokens, 0 on padding and tool output (any dtype)
    _: KW_ONLY
    index: Index = None  # (B,) the row's `uid`, the same for the n samples of one prompt (`@needs(groups=True)`)
    values: torch.Tensor | None = None  # (B, R) float: critic values (`@needs(values=True)`)
    gamma: float = 1.0  # discount per valid token (algorithm.gamma)
    lam: float = 1.0  # GAE lambda (algorithm.lam)
    norm_adv_by_std: bool = True  # grpo: divide by the group's std; False = Dr.GRPO (algorithm.norm_adv_by_std_in_grpo)
    epsilon: float = 1e-6  # grpo: added to the group's std
    reward_baselines: torch.Tensor | None = None  # (B,) the reward of the prompt's greedy response
    # (`@needs(greedy_baseline=True)`)
    reward_components: dict[str, torch.Tensor] | None = None  # name -> (B,) float: the reward manager's
    # `reward_extra/<name>` columns named by algorithm.gdpo_reward_keys (gdpo)
    reward_weights: Sequence[float] | None = None  # gdpo: a weight per component (algorithm.gdpo_reward_weights)
    old_log_probs: torch.Tensor | None = None  # (B, R) the actor's log-prob of each sampled token before the update
    sum_pi_squared: torch.Tensor | None = None  # (B, R) sum over the vocabulary of pi^2 at each token, from the
    # same forward (`@needs(sum_pi_squared=True)`)
    rollout_is_weights: torch.Tensor | None = None  # (B, R) truncated rollout importance weights (rollout correction)


AdvEstimator = Callable[[AdvantageInputs], tuple[torch.Tensor, torch.Tensor]]

#: name -> estimator; see the module docstring for the shared signature.
ADV_ESTIMATORS: Registry[AdvEstimator] = Registry("advantage estimator")


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
def gae(inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's GAE(gamma, lam) against critic `values`; advantages whitened over valid tokens."""
    if inputs.values is None:
        raise UserError("advantage estimator 'gae' needs critic values: enable the critic or pick grpo/rloo")
    mask = inputs.response_mask
    adv, returns = gae_unwhitened(inputs.token_level_rewards, inputs.values, mask, inputs.gamma, inputs.lam)
    return _whiten_valid(adv, mask), returns


@ADV_ESTIMATORS.register("grpo", "grpo_vectorized")
@torch.no_grad()
def grpo(inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """Group-relative outcome advantage (r - mean_g) / (std_g + eps); Dr.GRPO when not norm_adv_by_std.

    A group of one (e.g. rollout.n=1) has mean 0 and std 1, as in verl: its advantage is its score, REINFORCE
    without a baseline. So grpo does not need several samples per prompt; with them it compares them.
    """
    mask = inputs.response_mask
    scores = outcome_scores(inputs.token_level_rewards, mask)
    count, mean, std = group_stats(scores, group_ids(inputs.index, scores.shape[0], "grpo"))
    alone = count < 2
    mean = torch.where(alone, torch.zeros_like(mean), mean)
    std = torch.where(alone, torch.ones_like(std), std)
    centred = scores - mean
    if inputs.norm_adv_by_std:
        centred = centred / (std + inputs.epsilon)
    adv = _broadcast(centred, mask)
    return adv, adv


@ADV_ESTIMATORS.register("rloo", "rloo_vectorized")
@torch.no_grad()
def rloo(inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE leave-one-out: r_i - mean of the other samples = n/(n-1) * (r_i - mean_g). A group of one has
    no other sample: its baseline is 0 and its advantage its score, as in verl (so rollout.n=1 runs)."""
    mask = inputs.response_mask
    scores = outcome_scores(inputs.token_level_rewards, mask)
    count, mean, _std = group_stats(scores, group_ids(inputs.index, scores.shape[0], "rloo"))
    loo = count / (count - 1).clamp_min(1.0) * (scores - mean)
    adv = _broadcast(torch.where(count > 1, loo, scores), mask)
    return adv, adv


@ADV_ESTIMATORS.register("reinforce_plus_plus")
@torch.no_grad()
def reinforce_plus_plus(inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++: discounted return-to-go per token, whitened across the batch (no critic, no groups)."""
    returns = discounted_returns(inputs.token_level_rewards, inputs.response_mask, inputs.gamma)
    return _whiten_valid(returns, inputs.response_mask), returns


@ADV_ESTIMATORS.register("reinforce_plus_plus_baseline")
@torch.no_grad()
def reinforce_plus_plus_baseline(inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ with a group-mean baseline on the outcome, then batch whitening over valid tokens. A group of one
    has baseline 0, as in verl (so rollout.n=1 runs)."""
    mask = inputs.response_mask
    scores = outcome_scores(inputs.token_level_rewards, mask)
    count, mean, _std = group_stats(scores, group_ids(inputs.index, scores.shape[0], "reinforce_plus_plus_baseline"))
    mean = torch.where(count > 1, mean, torch.zeros_like(mean))
    adv = _whiten_valid(_broadcast(scores - mean, mask), mask)
    return adv, adv


@ADV_ESTIMATORS.register("remax")
@needs(greedy_baseline=True)
@torch.no_grad()
def remax(inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax: return-to-go minus the reward of a greedy response to the same prompt (`reward_baselines`, (B,)).

    The greedy response is the policy's own "typical" answer, so the baseline costs one extra
    generation per prompt instead of a critic, and works with one sample per prompt. The trainer
    generates and scores it because this estimator declares `@needs(greedy_baseline=True)`.
    """
    baselines = inputs.reward_baselines
    if baselines is None:
        raise UserError("advantage estimator 'remax' needs reward_baselines: the greedy sample's reward per row")
    returns = discounted_returns(inputs.token_level_rewards, inputs.response_mask, inputs.gamma)
    if baselines.numel() != returns.shape[0]:
        raise ValueError(f"remax: {baselines.numel()} reward_baselines for {returns.shape[0]} rows")
    baseline = baselines.to(returns).reshape(-1, 1)
    return (returns - baseline) * inputs.response_mask, returns
