"""verl's rejection modes, computed: each `RejectRule` (rlkit/config/rejection_modes.py, which reads the config)
reduces a per-token divergence between the engine and the trainer over its aggregate and keeps the tokens (or whole
rows) whose statistic lies within its bounds."""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlkit.algo.utils import masked_mean, masked_sum
from rlkit.config.rejection_modes import AGGREGATES, DIVERGENCES, RejectRule

#: divergence name -> per-token statistic of lr = log(pi_old / pi_rollout)
DIVERGENCE_FNS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "k1": lambda lr: -lr,
    "k2": lambda lr: 0.5 * lr * lr,
    "k3": lambda lr: torch.expm1(lr) - lr,
}


def _seq_max(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask > 0, values, torch.finfo(values.dtype).min).amax(dim=-1, keepdim=True)


#: aggregate name -> (per-token statistic, mask) -> the statistic each token is judged by
AGGREGATE_FNS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "token": lambda v, m: v,
    "seq_sum": lambda v, m: masked_sum(v, m, dim=-1, keepdim=True),
    "seq_mean": lambda v, m: masked_mean(v, m, dim=-1, keepdim=True),
    "seq_max": _seq_max,
}
assert tuple(DIVERGENCE_FNS) == DIVERGENCES and tuple(AGGREGATE_FNS) == AGGREGATES


def kept_by(rule: RejectRule, log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, R) bool: the tokens `rule` keeps (a row-level mode keeps or drops the whole row)."""
    stat = AGGREGATE_FNS[rule.aggregate](DIVERGENCE_FNS[rule.divergence](log_ratio), mask).expand_as(log_ratio)
    inside = stat <= rule.upper
    if rule.lower is not None:
        inside &= stat >= rule.lower
    return inside
