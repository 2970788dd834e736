"""Rollout correction: importance weights and rejection masks for the gap between the engine and the trainer.

The rollout engine samples with its own kernels and precision (and, one step off policy, with the
weights from before the last update), so the policy that drew a sample, pi_rollout (the engine's
`rollout_log_probs`), is not exactly the policy the loss treats as the sampler, pi_old
(`old_log_probs`). Per token r_t = pi_old(t) / pi_rollout(t). Two corrections, each at a *level*
looked up by name in `RATIO_LEVELS` (the config never branches on a level's name):

* importance sampling (`algorithm.rollout_is`): a weight on every token's policy-gradient loss,
  truncated from above at `algorithm.rollout_is_threshold` (truncated IS, TIS):
      token      w_t = min(r_t, threshold)
      sequence   w_t = min(prod_s r_s, threshold)          the same weight for every token of the row
      geometric  w_t = min((prod_s r_s)^(1/n), threshold)  length-normalised (biased, low variance)
* rejection (`algorithm.rollout_rs`): tokens or whole rows whose ratio at that level lies outside
  [`rollout_rs_threshold_lower`, `rollout_rs_threshold`] get weight 0 (OpenRLHF's icepop is token-level
  rejection, its seq-mask-tis is geometric rejection with token IS).

Products and means run over the valid tokens (response_mask 1) only; padding and tool/user tokens never
count. All ratios are computed in log space and bounded to exp(+-MAX_LOG_RATIO), so a diverged
sample gives a large finite number, never inf.

Normalisation: the correction is one detached weight per token, multiplied into the per-token
policy-gradient loss before aggregation; `response_mask` itself is not changed. A rejected token
therefore adds no gradient but still counts in the denominator of token-mean (and a fully
rejected row still counts as a sequence in the seq-mean modes): the loss is the mean over all
valid tokens of weight x loss, so masking half a batch halves its gradient instead of
re-scaling the rest up. This keeps micro-batch losses adding up exactly to the mini-batch loss
(rlkit.workers.micro_batch.loss_scales counts the unchanged mask) and is OpenRLHF's convention
(verl instead drops rejected tokens from the denominator). The entropy bonus and KL loss are not weighted.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from rlkit.algo.rejection_modes import kept_by
from rlkit.algo.utils import masked_mean, masked_sum
from rlkit.config.rejection_modes import RejectRule, is_verl_modes, parse_rules
from rlkit.config.rollout_correction import level, rs_bounds
from rlkit.registry import Registry

if TYPE_CHECKING:
    from rlkit.config.schema import AlgorithmConfig

#: (log_ratio (B, R) zero where invalid, mask (B, R) float) -> log of the ratio at this level, (B, R)
#: (a row-level ratio broadcast to every token of its row).
RatioLevel = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

#: level name -> how token log-ratios combine; `algorithm.rollout_is` and `algorithm.rollout_rs` name one.
RATIO_LEVELS: Registry[RatioLevel] = Registry("rollout correction level")

#: bound on every log-ratio (per token and per row) before exp(): exp(20) ~ 5e8.
MAX_LOG_RATIO = 20.0

PREFIX = "rollout_corr/"


@RATIO_LEVELS.register("token")
def token_level(log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each token its own ratio r_t."""
    return log_ratio


token_level.per_token = True  # type: ignore[attr-defined] - batch_sums averages its weights over tokens, not rows


@RATIO_LEVELS.register("sequence")
def sequence_level(log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The row's ratio prod_t r_t = exp(sum_t log r_t) over its valid tokens."""
    total = masked_sum(log_ratio, mask, dim=-1, keepdim=True).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    return total.expand_as(log_ratio)


@RATIO_LEVELS.register("geometric")
def geometric_level(log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The geometric mean of the row's token ratios, exp(mean_t log r_t): independent of the length."""
    return masked_mean(log_ratio, mask, dim=-1, keepdim=True).expand_as(log_ratio)


@dataclass(frozen=True)
class Correction:
    """`weights` (B, R): detached, 0 at invalid and rejected tokens; `kept` (B, R) bool; metrics under PREFIX."""

    weights: torch.Tensor
    kept: torch.Tensor
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class RolloutCorrection:
    """The configured correction (levels are RATIO_LEVELS names; None = that half is off). Built on the
    driver from `algorithm` (`from_config`), applied by the actor to each micro-batch (`__call__`)."""

    is_level: str | None = None
    is_threshold: float = 2.0
    rs_level: str | None = None
    rs_lower: float = 0.5
    rs_upper: float = 2.0
    batch_normalize: bool = False  # divide the IS weights by their batch mean (`is_scale`, from `batch_sums`)
    rs_rules: tuple[RejectRule, ...] = ()  # verl's rejection modes (rlkit/algo/rejection_modes.py), all must keep
    bypass: bool = False  # bypass_mode: the ratio is the current policy's (detached) over the engine's, as verl's
    apply_is: bool = True  # False for bypass_mode with a ratio loss (ppo_clip): its ratio already is pi / pi_rollout

    def __post_init__(self) -> None:
        for name in (self.is_level, self.rs_level):
            if name is not None:
                RATIO_LEVELS.get(name)  # UserError naming the known levels
        if self.is_threshold <= 0:
            raise ValueError(f"is_threshold must be > 0, got {self.is_threshold}")
        if not 0 < self.rs_lower < self.rs_upper:
            raise ValueError(f"rejection bounds must satisfy 0 < lower < upper, got [{self.rs_lower}, {self.rs_upper}]")

    @classmethod
    def from_config(cls, algo: AlgorithmConfig) -> RolloutCorrection | None:
        """From the `algorithm` section (rlkit.config.rollout_correction reads its keys); None when neither
        importance sampling nor rejection is on."""
        is_level = level("rollout_is", algo.rollout_is, allow_true=True)
        verl_modes = isinstance(algo.rollout_rs, list) or is_verl_modes(algo.rollout_rs)
        rules = parse_rules(algo.rollout_rs, algo.rollout_rs_threshold) if verl_modes else ()
        rs_level = None if verl_modes else level("rollout_rs", algo.rollout_rs, allow_true=False)
        if is_level is None and rs_level is None and not rules:
            return None
        lower, upper = rs_bounds(algo) if rs_level is not None else (0.5, 2.0)
        bypass = bool(getattr(algo, "bypass_mode", False))
        return cls(
            is_level=is_level,
            is_threshold=float(algo.rollout_is_threshold),
            rs_level=rs_level,
            rs_lower=lower,
            rs_upper=upper,
            batch_normalize=bool(getattr(algo, "rollout_is_batch_normalize", False)) and is_level is not None,
            rs_rules=rules,
            bypass=bypass,
            apply_is=not bypass or getattr(algo, "bypass_loss", "ppo_clip") == "reinforce",
        )

    def __call__(
        self, old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, response_mask: torch.Tensor,
        is_scale: float = 1.0,
    ) -> Correction:
        """Weights and rejection mask for one batch of responses (all (B, R)); no gradient flows through them.
        `is_scale`: the batch mean the truncated IS weights are divided by (`batch_normalize`; 1 = none)."""
        with torch.no_grad():
            mask = response_mask.float()
            valid = mask > 0
            diff = old_log_prob.float() - rollout_log_prob.float()  # padding may hold anything, even inf
            log_ratio = torch.where(valid, diff, 0.0).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
            metrics = _ratio_metrics(log_ratio, valid)
            weights = mask.clone()
            if self.is_level is not None and self.apply_is:
                log_w = RATIO_LEVELS.get(self.is_level)(log_ratio, mask)
                cap = math.log(self.is_threshold)
                weights = torch.exp(log_w.clamp(max=cap)) * mask
                metrics.update(_is_metrics(weights, log_w > cap, valid))
                if self.batch_normalize:
                    if self.bypass:  # the weights exist only inside the loss: their mean over this micro-batch
                        is_scale = is_scale_of(self._weight_sums(weights, mask))
                    weights = weights / is_scale
                    metrics[PREFIX + "is_batch_norm_factor"] = float(is_scale)
            kept = valid
            if self.rs_level is not None:
                stat = RATIO_LEVELS.get(self.rs_level)(log_ratio, mask)
                kept = kept & (stat >= math.log(self.rs_lower)) & (stat <= math.log(self.rs_upper))
            for rule in self.rs_rules:
                kept = kept & kept_by(rule, log_ratio, mask)
            if self.rs_level is not None or self.rs_rules:
                weights = weights * kept
                metrics.update(_rejection_metrics(kept, valid))
        return Correction(weights=weights.detach(), kept=kept, metrics=metrics)


    def batch_sums(self, old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor,
                   response_mask: torch.Tensor) -> torch.Tensor:
        """(sum, count) of the truncated IS weights whose mean `batch_normalize` divides by, as verl averages them:
        over valid tokens at the token level, over rows (one weight each) at a row level. Summed over a batch's
        shards (ranks), sum / count is `is_scale`."""
        with torch.no_grad():
            mask = response_mask.float()
            valid = mask > 0
            diff = old_log_prob.float() - rollout_log_prob.float()
            log_ratio = torch.where(valid, diff, 0.0).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
            log_w = RATIO_LEVELS.get(self.is_level)(log_ratio, mask)
            weights = torch.exp(log_w.clamp(max=math.log(self.is_threshold))) * mask
            return self._weight_sums(weights, mask)

    def _weight_sums(self, weights: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """(sum, count) of truncated IS weights: per valid token at the token level, per row otherwise."""
        if getattr(RATIO_LEVELS.get(self.is_level), "per_token", False):
            return torch.stack([weights.sum(), mask.sum()])
        rows = (mask > 0).any(dim=-1)
        row_w = masked_mean(weights, mask, dim=-1)
        return torch.stack([row_w[rows].sum(), rows.sum().float()])


def is_scale_of(sums: torch.Tensor) -> float:
    """The batch mean from `batch_sums` (summed over ranks); 1 when there is nothing to average (verl's guard)."""
    mean = float(sums[0]) / max(float(sums[1]), 1.0)
    return mean if mean > 1e-8 else 1.0


def _ratio_metrics(log_ratio: torch.Tensor, valid: torch.Tensor) -> dict[str, float]:
    """The raw token ratios pi_old / pi_rollout over valid tokens (for choosing bounds)."""
    if not valid.any():
        return {}
    vals = log_ratio[valid]
    return {
        PREFIX + "token_ratio_max": float(vals.max().exp()),
        PREFIX + "token_ratio_min": float(vals.min().exp()),
        PREFIX + "log_ratio_abs_mean": float(vals.abs().mean()),
    }


def _is_metrics(weights: torch.Tensor, truncated: torch.Tensor, valid: torch.Tensor) -> dict[str, float]:
    """Truncated IS weights over valid tokens (before rejection), and how many hit the threshold."""
    if not valid.any():
        return {}
    w = weights[valid]
    return {
        PREFIX + "is_weight_mean": float(w.mean()),
        PREFIX + "is_weight_max": float(w.max()),
        PREFIX + "is_truncated_frac": float((truncated & valid).sum() / valid.sum()),
    }


def _rejection_metrics(kept: torch.Tensor, valid: torch.Tensor) -> dict[str, float]:
    """Fraction of valid tokens rejected, and of rows (with >= 1 valid token) rejected entirely."""
    rows = valid.any(dim=-1)
    if not rows.any():
        return {PREFIX + "masked_token_frac": 0.0, PREFIX + "masked_seq_frac": 0.0}
    dropped_rows = rows & ~kept.any(dim=-1)
    return {
        PREFIX + "masked_token_frac": float((valid & ~kept).sum() / valid.sum()),
        PREFIX + "masked_seq_frac": float(dropped_rows.sum() / rows.sum()),
    }
