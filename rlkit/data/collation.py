"""Rows -> Batch: left-pad the prompt ids to a fixed length and keep raw fields as non-tensors.

Left padding puts every prompt's last token in the same column, so generation
starts at one position for the whole batch; a fixed width (max_prompt_length)
keeps tensor shapes stable from step to step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from rlkit.protocol import Batch

TENSOR_KEY = "input_ids"


def left_pad(
    sequences: Sequence[Sequence[int]], length: int, pad_token_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask, position_ids), each (B, length) long; sequences must fit.

    Built in numpy (single-threaded, no per-op dispatch) and handed to torch without a copy.
    """
    input_ids = np.full((len(sequences), length), pad_token_id, dtype=np.int64)
    attention_mask = np.zeros((len(sequences), length), dtype=np.int64)
    for i, seq in enumerate(sequences):
        n = len(seq)
        if n > length:
            raise ValueError(f"left_pad: row {i} has {n} tokens, longer than {length}")
        if n:
            input_ids[i, length - n :] = seq
            attention_mask[i, length - n :] = 1
    position_ids = np.maximum(np.cumsum(attention_mask, axis=1) - 1, 0)
    return torch.from_numpy(input_ids), torch.from_numpy(attention_mask), torch.from_numpy(position_ids)


def collate(rows: Sequence[Mapping[str, Any]], max_prompt_length: int, pad_token_id: int) -> Batch:
    """Rows from `RLDataset.__getitem__` -> a Batch (tensors + every other key as a non-tensor)."""
    if not rows:
        raise ValueError("collate: no rows")
    input_ids, attention_mask, position_ids = left_pad([r[TENSOR_KEY] for r in rows], max_prompt_length, pad_token_id)
    keys = [k for k in rows[0] if k != TENSOR_KEY]
    non_tensors = {k: [r.get(k) for r in rows] for k in keys}
    return Batch(
        {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids},
        non_tensors,
    )
