"""RL algorithms as pure tensor functions, each found by name in a registry.

The trainer reads a name from the config and calls `REGISTRY.get(name)(...)`; it
never branches on algorithm names.
"""

from rlkit.algo.advantages import ADV_ESTIMATORS
from rlkit.algo.dapo import DynamicSamplingResult, dynamic_sampling_filter, overlong_reward_shaping
from rlkit.algo.kl import (
    KL_CONTROLLERS,
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    kl_penalty,
    make_kl_controller,
)
from rlkit.algo.metrics import compute_data_metrics
from rlkit.algo.policy_loss import POLICY_LOSSES
from rlkit.algo.utils import (
    LOSS_AGG,
    agg_loss,
    entropy_from_logits,
    logprobs_from_logits,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
)
from rlkit.algo.value_loss import compute_value_loss

__all__ = [
    "ADV_ESTIMATORS",
    "KL_CONTROLLERS",
    "KL_ESTIMATORS",
    "LOSS_AGG",
    "POLICY_LOSSES",
    "AdaptiveKLController",
    "DynamicSamplingResult",
    "FixedKLController",
    "agg_loss",
    "apply_kl_penalty",
    "compute_data_metrics",
    "compute_value_loss",
    "dynamic_sampling_filter",
    "entropy_from_logits",
    "kl_penalty",
    "logprobs_from_logits",
    "make_kl_controller",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "overlong_reward_shaping",
]
