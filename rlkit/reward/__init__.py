"""Rewards: scorers chosen by data_source (gsm8k, math, toy_copy, code, or a user
function), a sandbox for running model-written code, and the RewardManager that
turns a rollout Batch into `token_level_scores`. See DESIGN.md section 5.
"""

from rlkit.reward.custom import CustomReward, bind_custom, load_custom_fn
from rlkit.reward.manager import RewardManager, SampleScore
from rlkit.reward.registry import DATA_SOURCES, SCORERS, get_scorer, load_builtin_scorers, scorer_name_for

load_builtin_scorers()

__all__ = [
    "CustomReward",
    "DATA_SOURCES",
    "SCORERS",
    "RewardManager",
    "SampleScore",
    "bind_custom",
    "get_scorer",
    "load_builtin_scorers",
    "load_custom_fn",
    "scorer_name_for",
]
