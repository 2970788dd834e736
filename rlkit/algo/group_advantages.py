"""Outcome estimators that compare the samples of one prompt beyond mean/std (ADV_ESTIMATORS): pass@k, OPO,
GPG, GDPO. Same signature as rlkit.algo.advantages; each reads `index` (`@needs(groups=True)`).
"""

from __future__ import annotations

import torch

from rlkit.algo.advantages import (
    ADV_ESTIMATORS,
    AdvantageInputs,
    _broadcast,
    group_ids,
    group_stats,
    outcome_scores,
)
from rlkit.algo.needs import needs
from rlkit.errors import UserError


def _group_sum(values: torch.Tensor, gid: torch.Tensor) -> torch.Tensor:
    """Per-row sum of `values` over the row's group."""
    return values.new_zeros(int(gid.max()) + 1).index_add(0, gid, values)[gid]


@ADV_ESTIMATORS.register("grpo_passk")
@needs(groups=True)
@torch.no_grad()
def grpo_passk(inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """Pass@k (as verl's grpo_passk): only the best sample of a group learns, with r_max - r_second (divided by
    the group's std unless Dr.GRPO); a pass@k reward credits the group for its best answer alone. A group of
    one gets 0 (verl raises)."""
    mask = inputs.response_mask
    scores = outcome_scores(inputs.token_level_rewards, mask)
    gid = group_ids(inputs.index, scores.shape[0], "grpo_passk")
    _count, _mean, std = group_stats(scores, gid)
    adv = torch.zeros_like(scores)
    for g in range(int(gid.max()) + 1):
        rows = torch.nonzero(gid == g).flatten()
        if len(rows) < 2:  # no second sample to compare with: no signal, as grpo's group of one
            continue
        top = torch.topk(scores[rows], 2)
        gap = top.values[0] - top.values[1]
        if inputs.norm_adv_by_std:
            gap = gap / (std[rows[0]] + inputs.epsilon)
        adv[rows[top.indices[0]]] = gap
    adv = _broadcast(adv, mask)
    return adv, adv


@ADV_ESTIMATORS.register("opo")
@needs(groups=True)
@torch.no_grad()
def opo(inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """OPO (arXiv 2505.23585): the optimal baseline for exact on-policy training, the length-weighted group
    mean sum_j |o_j| r_j / sum_j |o_j|; a group of one has baseline 0 (as verl)."""
    mask = inputs.response_mask
    scores = outcome_scores(inputs.token_level_rewards, mask)
    gid = group_ids(inputs.index, scores.shape[0], "opo").to(scores.device)
    lengths = mask.sum(-1).to(scores.dtype)
    count = _group_sum(torch.ones_like(scores), gid)
    baseline = _group_sum(lengths * scores, gid) / _group_sum(lengths, gid).clamp_min(1e-8)
    adv = _broadcast(scores - torch.where(count > 1, baseline, torch.zeros_like(baseline)), mask)
    return adv, adv


@ADV_ESTIMATORS.register("gpg")
@needs(groups=True)
@torch.no_grad()
def gpg(inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """GPG (arXiv 2504.02546): A = alpha (r - mean_g), alpha = B / (samples in groups whose rewards differ).

    Groups whose rewards are all equal give no gradient; alpha rescales so the others are not diluted by
    them (the paper's gradient correction, F_norm = 1). verl counts the samples with a non-zero reward
    instead; we follow the paper.
    """
    mask = inputs.response_mask
    scores = outcome_scores(inputs.token_level_rewards, mask)
    count, mean, std = group_stats(scores, group_ids(inputs.index, scores.shape[0], "gpg"))
    informative = (count > 1) & (std > 0)
    alpha = scores.shape[0] / max(int(informative.sum()), 1)
    adv = _broadcast(torch.where(count > 1, alpha * (scores - mean), torch.zeros_like(scores)), mask)
    return adv, adv


@ADV_ESTIMATORS.register("gdpo")
@needs(groups=True)
@torch.no_grad()
def gdpo(inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """GDPO (arXiv 2601.05242): normalise each reward component within its group, then sum (weighted), then
    whiten the sums over the batch's responses, so one component's scale cannot drown the others.

    Components are the reward manager's `reward_extra/<name>` columns named by algorithm.gdpo_reward_keys
    (a scorer returning {"score": ..., "<name>": ...}); the summed score is not used.
    """
    comps = inputs.reward_components
    if not comps:
        raise UserError("advantage estimator 'gdpo' normalises reward components separately: set "
                        "algorithm.gdpo_reward_keys to the names your scorer returns besides 'score'")
    weights = list(inputs.reward_weights) if inputs.reward_weights else [1.0] * len(comps)
    mask = inputs.response_mask
    gid = group_ids(inputs.index, mask.shape[0], "gdpo")
    total = torch.zeros(mask.shape[0], dtype=torch.float32, device=mask.device)
    for weight, values in zip(weights, comps.values(), strict=True):
        values = values.to(total)
        count, mean, std = group_stats(values, gid)
        centred = values - mean
        if inputs.norm_adv_by_std:
            centred = centred / (std + inputs.epsilon)
        total += weight * torch.where(count > 1, centred, torch.zeros_like(centred))
    rows = (mask.sum(-1) > 0).to(total)
    mean = (total * rows).sum() / rows.sum().clamp_min(1)
    std = torch.sqrt(((total - mean) ** 2 * rows).sum() / (rows.sum() - 1).clamp_min(1))
    adv = _broadcast((total - mean) / (std + inputs.epsilon), mask)
    return adv, adv
