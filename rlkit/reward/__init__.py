"""Rewards: the reward stage of a step is a reward manager chosen by `reward_model.reward_manager`
(`REWARD_MANAGERS`: `rule` = the RewardManager, one scorer per sample chosen by data_source:
gsm8k, math, toy_copy, code, or a user function; `coevolve` = the coder/tester pass matrix),
a sandbox for running model-written code. Every manager turns a rollout Batch into
`token_level_scores`, the score on the last valid response token (rlkit.reward.placement).
docs/rewards.md is the user's guide.
"""

from rlkit.reward.custom import CustomReward, bind_custom, load_custom_fn
from rlkit.reward.manager import RewardManager, SampleScore
from rlkit.reward.registry import (
    DATA_SOURCES,
    REWARD_MANAGERS,
    SCORERS,
    build_reward_manager,
    get_scorer,
    scorer_name_for,
)

__all__ = [
    "CustomReward",
    "DATA_SOURCES",
    "REWARD_MANAGERS",
    "SCORERS",
    "RewardManager",
    "SampleScore",
    "bind_custom",
    "build_reward_manager",
    "get_scorer",
    "load_custom_fn",
    "scorer_name_for",
]
