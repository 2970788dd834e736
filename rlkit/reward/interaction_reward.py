"""The simulated user's reward as part of the training reward (`multi_turn.interaction_reward_weight`).

The agent loop sums each episode's interaction rewards (rlkit/rollout/agent/interaction.py) into the
non-tensor `agent/interaction_reward`; by default it is only logged (`interaction/reward/mean`). With a
weight w != 0 the reward stage adds w x that sum to the sample's score, on its last model token like
every other reward, and logs `reward/interaction/mean` (the weighted part). The interaction is the
environment's side of the episode (a scripted or judged user), not text the policy wrote about
itself, so it may decide a reward.
"""

from __future__ import annotations

from typing import Any

import torch

from rlkit.protocol import METRICS_KEY, Batch
from rlkit.reward.placement import on_last_token
from rlkit.reward.registry import RewardFn

INTERACTION_KEY = "agent/interaction_reward"


class WithInteractionReward:
    """`inner(batch)` plus `weight` x each row's interaction reward (rows without one add 0)."""

    def __init__(self, inner: RewardFn, weight: float) -> None:
        self.inner, self.weight = inner, float(weight)

    def __call__(self, batch: Batch) -> Batch:
        out = self.inner(batch)
        if INTERACTION_KEY not in batch.non_tensors:  # not an agent rollout (e.g. a plain validation engine)
            return out
        values = torch.tensor([_number(v) for v in batch[INTERACTION_KEY]], dtype=torch.float32) * self.weight
        out["token_level_scores"] = out["token_level_scores"] + on_last_token(values, batch["response_mask"])
        metrics = dict(out.meta.get(METRICS_KEY, {}))
        metrics["reward/interaction/mean"] = [float(values.mean())] if len(values) else [0.0]
        out.meta[METRICS_KEY] = metrics
        return out

    def __getattr__(self, name: str) -> Any:  # the inner manager's helpers (e.g. close) stay reachable
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)


def _number(value: Any) -> float:
    try:
        return float(value) if value is not None else 0.0
    except (TypeError, ValueError):
        return 0.0


def with_interaction_reward(reward_fn: RewardFn, weight: float) -> RewardFn:
    """`reward_fn` as it is when the weight is 0 (the interaction reward only logged), else wrapped."""
    return reward_fn if weight == 0 else WithInteractionReward(reward_fn, weight)
