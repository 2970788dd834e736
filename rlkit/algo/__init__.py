"""RL algorithms as pure tensor functions, each found by name in a registry.

The trainer reads a name from the config and calls `REGISTRY.get(name)(...)`; it
never branches on algorithm names. What an entry needs (a critic, groups, the reference
model, a greedy baseline, an aggregation unit) is declared next to its registration
with `@needs(...)` (rlkit.algo.needs).
"""

from rlkit.algo import cov_losses, group_advantages, log_prob_losses, token_baselines  # noqa: F401 - register entries
from rlkit.algo.advantages import ADV_ESTIMATORS, AdvantageInputs
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
from rlkit.algo.loss_agg import LOSS_AGG, agg_loss
from rlkit.algo.metrics import compute_data_metrics
from rlkit.algo.needs import Needs, needs, needs_of
from rlkit.algo.policy_loss import POLICY_LOSSES
from rlkit.algo.run_needs import critic_enabled, ref_needed, run_needs
from rlkit.algo.utils import (
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
    "AdvantageInputs",
    "KL_CONTROLLERS",
    "KL_ESTIMATORS",
    "LOSS_AGG",
    "POLICY_LOSSES",
    "AdaptiveKLController",
    "DynamicSamplingResult",
    "FixedKLController",
    "Needs",
    "agg_loss",
    "apply_kl_penalty",
    "compute_data_metrics",
    "compute_value_loss",
    "critic_enabled",
    "dynamic_sampling_filter",
    "entropy_from_logits",
    "kl_penalty",
    "logprobs_from_logits",
    "make_kl_controller",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "needs",
    "needs_of",
    "overlong_reward_shaping",
    "ref_needed",
    "run_needs",
]
