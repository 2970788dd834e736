"""Policy-filtration PPO (PF-PPO, verl's `algorithm.use_pf_ppo`): after the advantages, the batch is resampled with
replacement, each row drawn with a weight computed from its total score, so rows with more reliable rewards are
trained on more often. verl applies it to GAE batches (its `adv_estimator=gae` branch); rlkit does the same.

Weights by `algorithm.pf_ppo.reweight_method` (a name in `REWEIGHTS`), over the rows' summed `token_level_scores` s:
    pow         |s| ** weight_pow
    max_min     1 for rows with the batch's highest or lowest score, else 0
    max_random  0.4 for rows with the highest score, else 0.1
Every weight gets 1e-8 added (a batch of zero scores is drawn uniformly).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlkit.protocol import Batch
from rlkit.registry import Registry

#: (scores (B,), weight_pow) -> sampling weights (B,)
Reweight = Callable[[torch.Tensor, float], torch.Tensor]
REWEIGHTS: Registry[Reweight] = Registry("pf_ppo reweight method")
FLOOR = 1e-8


@REWEIGHTS.register("pow")
def pow_weights(scores: torch.Tensor, weight_pow: float) -> torch.Tensor:
    return scores.abs().pow(weight_pow)


@REWEIGHTS.register("max_min")
def max_min_weights(scores: torch.Tensor, weight_pow: float) -> torch.Tensor:
    extreme = (scores == scores.max()) | (scores == scores.min())
    return extreme.to(scores.dtype)


@REWEIGHTS.register("max_random")
def max_random_weights(scores: torch.Tensor, weight_pow: float) -> torch.Tensor:
    return torch.where(scores == scores.max(), 0.4, 0.1).to(scores.dtype)


def pf_ppo_indices(scores: torch.Tensor, method: str, weight_pow: float,
                   generator: torch.Generator | None = None) -> torch.Tensor:
    """len(scores) row indices drawn with replacement, row i with probability proportional to its weight."""
    weights = (REWEIGHTS.get(method)(scores.float(), float(weight_pow)) + FLOOR).clamp(min=FLOOR)
    return torch.multinomial(weights, scores.shape[0], replacement=True, generator=generator)


def pf_ppo_resample(batch: Batch, method: str, weight_pow: float,
                    generator: torch.Generator | None = None) -> dict[str, float]:
    """Replace the batch's rows (in place) by the PF-PPO resample; returns its metrics."""
    scores = batch["token_level_scores"].float().sum(dim=-1)
    idx = pf_ppo_indices(scores, method, weight_pow, generator)
    batch.reorder(idx)
    return {"pf_ppo/unique_rows_frac": float(idx.unique().numel() / max(1, idx.numel())),
            "pf_ppo/score_mean_after": float(scores[idx].mean())}
