"""The driver's advantage stage (phase 5 of the RL step): rewards shaped, then the registered estimator.

Pure functions over a `Batch`, unit-testable without Ray.
"""

from __future__ import annotations

import torch

from rlkit.algo import ADV_ESTIMATORS, AdvantageInputs
from rlkit.algo.kl import apply_kl_penalty
from rlkit.algo.pf_ppo import pf_ppo_resample
from rlkit.algo.rollout_correction import RolloutCorrection
from rlkit.config.schema import RLConfig
from rlkit.errors import UserError
from rlkit.protocol import Batch
from rlkit.reward.overlong import OverlongBuffer
from rlkit.reward.placement import on_last_token


def shape_rewards(batch: Batch, cfg: RLConfig, kl_ctrl) -> dict[str, float]:
    """token_level_scores -> token_level_rewards: optional overlong penalty and in-reward KL."""
    metrics: dict[str, float] = {}
    scores = batch["token_level_scores"].clone()
    overlong = OverlongBuffer.parse(cfg.reward_model.overlong_buffer, "reward_model.overlong_buffer")
    if overlong.enable:  # the same penalty as the `dapo` reward manager's (rlkit.reward.overlong), after scoring
        penalty = overlong.penalty(batch["response_mask"], cfg.data.max_response_length)
        scores += on_last_token(penalty, batch["response_mask"])
        for key, column in overlong.extras(penalty).items():
            batch[key] = column
        metrics["reward/overlong_penalty/mean"] = float(penalty.mean())
    if cfg.algorithm.use_kl_in_reward:
        rewards, kl_metrics = apply_kl_penalty(
            scores, batch["old_log_probs"], batch["ref_log_prob"], batch["response_mask"].float(),
            kl_ctrl, cfg.algorithm.kl_penalty,
        )
        metrics.update(kl_metrics)
    else:
        rewards = scores
    batch["token_level_rewards"] = rewards
    return metrics


def reward_components(batch: Batch, names: list[str]) -> dict[str, torch.Tensor] | None:
    """The reward manager's `reward_extra/<name>` columns named in `names`, as (B,) float tensors."""
    if not names:
        return None
    out = {}
    for name in names:
        key = f"reward_extra/{name}"
        if key not in batch:
            raise UserError(f"algorithm.gdpo_reward_keys names '{name}' but the reward manager returned no {key}: "
                            "return it from your scorer ({'score': ..., " + repr(name) + ": ...})")
        out[name] = torch.tensor([float(v) for v in batch[key]], dtype=torch.float32)
    return out


def rollout_is_weights(batch: Batch, cfg: RLConfig) -> torch.Tensor | None:
    """The rollout correction's per-token weights (algorithm.rollout_is / rollout_rs: truncated IS x kept), as the
    actor's loss applies them, when the correction is on and the batch has both log-probs; else None."""
    correction = RolloutCorrection.from_config(cfg.algorithm)
    if correction is None or "old_log_probs" not in batch or "rollout_log_probs" not in batch:
        return None
    return correction(batch["old_log_probs"], batch["rollout_log_probs"], batch["response_mask"]).weights


def compute_advantages(batch: Batch, cfg: RLConfig) -> None:
    """Look the estimator up by name and write `advantages` and `returns` into the batch."""
    algo = cfg.algorithm
    estimator = ADV_ESTIMATORS.get(algo.adv_estimator)
    advantages, returns = estimator(AdvantageInputs(
        batch["token_level_rewards"],
        batch["response_mask"].float(),
        index=batch["uid"] if "uid" in batch else None,
        values=batch["values"] if "values" in batch else None,
        gamma=algo.gamma,
        lam=algo.lam,
        norm_adv_by_std=algo.norm_adv_by_std_in_grpo,
        reward_baselines=batch["reward_baselines"] if "reward_baselines" in batch else None,
        reward_components=reward_components(batch, algo.gdpo_reward_keys),
        reward_weights=algo.gdpo_reward_weights,
        old_log_probs=batch["old_log_probs"] if "old_log_probs" in batch else None,
        sum_pi_squared=batch["sum_pi_squared"] if "sum_pi_squared" in batch else None,  # @needs(sum_pi_squared)
        rollout_is_weights=rollout_is_weights(batch, cfg),
    ))
    batch["advantages"] = advantages.float()
    batch["returns"] = returns.float()
    if algo.use_pf_ppo:  # PF-PPO (rlkit.algo.pf_ppo): the batch resampled by score, after its advantages
        pf_ppo_resample(batch, algo.pf_ppo.reweight_method, algo.pf_ppo.weight_pow)
