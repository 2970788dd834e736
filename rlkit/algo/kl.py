"""KL between the policy and the reference model: estimators, reward folding, coefficient control.

KL can enter training two ways, both built from `kl_penalty`:
* as a loss term (actor `use_kl_loss`): agg_loss(kl_penalty(logp, ref, name), mask, mode);
* folded into the reward (`algorithm.use_kl_in_reward`): `apply_kl_penalty`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch

from rlkit.algo.utils import masked_mean
from rlkit.registry import Registry

KLEstimator = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

#: name -> fn(logp, ref_logp) -> per-token KL estimate (same shape).
KL_ESTIMATORS: Registry[KLEstimator] = Registry("KL estimator")


@KL_ESTIMATORS.register("k1", "kl")
def k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Unbiased, high variance, can be negative per token."""
    return logp - ref_logp


@KL_ESTIMATORS.register("abs")
def abs_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    return (logp - ref_logp).abs()


@KL_ESTIMATORS.register("k2", "mse")
def k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Biased but low variance and non-negative; its gradient matches the true KL's to first order."""
    return 0.5 * (logp - ref_logp).square()


@KL_ESTIMATORS.register("k3", "low_var_kl")
def k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Unbiased and non-negative: r - log r - 1 with r = p_ref / p. Clamped to [-10, 10] for stability.

    Written as expm1(log r) - log r: the same value, but never below 0 in floating point (exp(x) - x - 1
    rounds to -6e-8 at x = 1e-6 in float32)."""
    log_r = torch.clamp(ref_logp - logp, -20.0, 20.0)
    return torch.clamp(torch.expm1(log_r) - log_r, -10.0, 10.0)


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, name: str = "k1") -> torch.Tensor:
    """Per-token KL(policy || ref) estimate with the registered estimator `name`."""
    return KL_ESTIMATORS.get(name)(logp, ref_logp)


# ---------------------------------------------------------------- controllers
class KLController(Protocol):
    value: float

    def update(self, current_kl: float, n_steps: int) -> None: ...


class FixedKLController:
    """A constant coefficient."""

    def __init__(self, coef: float) -> None:
        self.value = float(coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Nothing to adapt."""


class AdaptiveKLController:
    """Proportional controller (Ziegler et al. 2019) that steers the observed KL toward `target_kl`.

    value *= 1 + clip(kl / target - 1, -0.2, 0.2) * n_steps / horizon; the clip keeps one
    noisy batch from moving the coefficient by more than 20% of n_steps/horizon.
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int) -> None:
        if target_kl <= 0 or horizon <= 0:
            raise ValueError(f"adaptive KL needs target_kl > 0 and horizon > 0, got {target_kl}, {horizon}")
        self.value = float(init_kl_coef)
        self.target = float(target_kl)
        self.horizon = int(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        error = min(max(float(current_kl) / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon


#: name -> builder(kl_coef, target_kl, horizon) -> controller. Chosen by `algorithm.kl_ctrl.type`.
KL_CONTROLLERS: Registry[Callable[..., KLController]] = Registry("KL controller")


@KL_CONTROLLERS.register("fixed")
def _fixed(kl_coef: float = 0.001, **_: Any) -> KLController:
    return FixedKLController(kl_coef)


@KL_CONTROLLERS.register("adaptive")
def _adaptive(kl_coef: float = 0.001, target_kl: float = 0.1, horizon: int = 10000, **_: Any) -> KLController:
    return AdaptiveKLController(kl_coef, target_kl, horizon)


def make_kl_controller(
    type: str = "fixed", kl_coef: float = 0.001, target_kl: float = 0.1, horizon: int = 10000
) -> KLController:
    """Build the controller named by `algorithm.kl_ctrl.type`."""
    return KL_CONTROLLERS.get(type)(kl_coef=kl_coef, target_kl=target_kl, horizon=horizon)


# ---------------------------------------------------------------- KL in reward
@torch.no_grad()
def apply_kl_penalty(
    token_level_scores: torch.Tensor,
    old_log_prob: torch.Tensor,
    ref_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    kl_ctrl: KLController,
    name: str = "k1",
) -> tuple[torch.Tensor, dict[str, float]]:
    """rewards = scores - beta * KL per valid token, then feed the batch KL back to `kl_ctrl`.

    The reported KL is the mean over rows of each row's mean token KL; the
    controller is updated with n_steps = batch size, and the metrics show the
    coefficient that was applied (before the update).
    """
    kld = kl_penalty(old_log_prob, ref_log_prob, name) * response_mask
    beta = kl_ctrl.value
    rewards = token_level_scores - beta * kld
    current_kl = float(masked_mean(kld, response_mask, dim=-1).mean())
    kl_ctrl.update(current_kl, n_steps=token_level_scores.shape[0])
    return rewards, {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": float(beta)}
