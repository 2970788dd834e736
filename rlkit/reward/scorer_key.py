"""`data.reward_fn_key`: the column whose value selects a row's reward scorer (verl's key, default `data_source`).

The reward stage (managers, the mix, custom functions) reads the selector as `data_source`; with another
key the stage is handed a view of the batch whose `data_source` is that column, so every scorer lookup,
per-source weight and custom function's `data_source=` argument follow it. The batch itself is unchanged
(`val/<data_source>/...` metrics still group by the real data_source).
"""

from __future__ import annotations

from typing import Any

from rlkit.errors import UserError
from rlkit.protocol import Batch
from rlkit.reward.registry import RewardFn

DEFAULT_KEY = "data_source"


class WithScorerKey:
    """`inner(view)` where the view's `data_source` is the batch's `key` column."""

    def __init__(self, inner: RewardFn, key: str) -> None:
        self.inner, self.key = inner, key

    def __call__(self, batch: Batch) -> Batch:
        if self.key not in batch.non_tensors:
            raise UserError(missing_key_message(self.key, batch.keys()))
        view = Batch(batch.tensors, {**batch.non_tensors, DEFAULT_KEY: batch.non_tensors[self.key]}, batch.meta)
        return self.inner(view)

    def __getattr__(self, name: str) -> Any:  # the inner stage's helpers (e.g. close) stay reachable
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)


def with_scorer_key(reward_fn: RewardFn, key: str) -> RewardFn:
    """`reward_fn` as it is for the default key, else wrapped."""
    return reward_fn if key == DEFAULT_KEY else WithScorerKey(reward_fn, key)


def missing_key_message(key: str, columns: list[str]) -> str:
    return (f"data.reward_fn_key='{key}' names no column of the data (columns: {', '.join(sorted(columns))}); "
            f"set it to the column that selects the reward scorer (default {DEFAULT_KEY})")
