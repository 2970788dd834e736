"""DAPO pieces: dynamic sampling (drop groups without signal) and overlong reward shaping."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


@dataclass
class DynamicSamplingResult:
    """Which rows survive; the trainer keeps them and samples more prompts until the batch is full."""

    keep_mask: np.ndarray  # (B,) bool
    keep_indices: np.ndarray  # (K,) int64, in row order
    kept_groups: int
    total_groups: int


def _to_numpy(x: Any) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().double().numpy()
    return np.asarray(x, dtype=np.float64)


def dynamic_sampling_filter(
    metric_values: np.ndarray | torch.Tensor | Sequence[float],
    uids: np.ndarray | Sequence[Any],
    *,
    atol: float = 0.0,
    keep_singletons: bool = True,
) -> DynamicSamplingResult:
    """Drop every group (same uid) whose metric is identical across its samples.

    If all n answers to a prompt score the same, group-relative advantages are
    all zero and the group only dilutes the batch. A group of one has no spread
    to measure; it is kept by default so n=1 runs are not emptied.
    """
    vals = _to_numpy(metric_values).reshape(-1)
    uids = list(uids)
    if len(uids) != len(vals):
        raise ValueError(f"dynamic_sampling_filter: {len(vals)} metric values for {len(uids)} uids")
    rows: dict[Any, list[int]] = {}
    for i, u in enumerate(uids):
        rows.setdefault(u, []).append(i)
    keep = np.zeros(len(vals), dtype=bool)
    kept = 0
    for idx in rows.values():
        group = vals[idx]
        informative = np.ptp(group) > atol if len(idx) > 1 else keep_singletons
        if informative:
            keep[idx] = True
            kept += 1
    return DynamicSamplingResult(keep, np.flatnonzero(keep).astype(np.int64), kept, len(rows))


def overlong_reward_shaping(
    response_lengths: torch.Tensor | np.ndarray | Sequence[int],
    max_response_length: int,
    overlong_buffer_len: int,
    penalty_factor: float = 1.0,
) -> torch.Tensor:
    """DAPO's soft length penalty per row (float32), verl's formula:
    `min(-(length - (max - buffer)) / buffer * penalty_factor, 0)`.

    0 up to max - buffer, then linear down to -penalty_factor at max: the ramp tells the model "too long"
    before truncation does, instead of a cliff that punishes sound reasoning cut off by the limit. There is
    no floor: a length past `max_response_length` (a `max_resp_len` below the engine's limit) keeps going down.
    """
    if overlong_buffer_len <= 0:
        raise ValueError(f"overlong_buffer_len must be > 0, got {overlong_buffer_len}")
    if penalty_factor < 0:
        raise ValueError(f"penalty_factor must be >= 0, got {penalty_factor}")
    if isinstance(response_lengths, torch.Tensor):
        lengths = response_lengths.detach().float()
    else:
        lengths = torch.as_tensor(np.asarray(response_lengths, dtype=np.float32))
    expected = max_response_length - overlong_buffer_len
    penalty = -(lengths - expected) / overlong_buffer_len * penalty_factor
    return penalty.clamp(max=0.0)
