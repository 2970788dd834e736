"""The precomputed reference of a DPO run (dpo.ref.precompute, TRL's precompute_ref_log_probs).

Every loss reads the frozen reference through one number per completion (rlkit.algo.preference_loss
`reference_logps`), so the reference can score every training and validation pair once, before step 1, and be
dropped from the workers: a step then reads those numbers by the pairs' dataset rows (`pair_index`), whatever the
shuffle, epoch or resume point. The scores are not checkpointed: they are recomputed at every start, resume included
(one pass over the data, cheaper than a step's worth of state to keep in step with the data files).

The pass runs the very forward of the per-step path (the workers' `compute_ref_logps`), in chunks of
data.train_batch_size rows in dataset order: a step whose batch is the same rows (data.shuffle=false) gets the same
float32 numbers bit for bit; another grouping pads differently and may differ in the last float32 bits.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

log = logging.getLogger(__name__)

Progress = Callable[[str, int, int], None]


def chunks(total: int, size: int, world_size: int) -> Iterator[tuple[list[int], int]]:
    """(rows, n) per chunk of `size` dataset rows: the first n are new, the rest repeat the last one so that every
    worker gets an equal shard (the repeats' results are dropped)."""
    for lo in range(0, total, size):
        rows = list(range(lo, min(lo + size, total)))
        n = len(rows)
        yield rows + [rows[-1]] * ((-n) % world_size), n


def score_pairs(model: Any, dataset: Any, size: int, world_size: int, progress: Progress, name: str) -> torch.Tensor:
    """(len(dataset), 2) float32: the reference's chosen and rejected completion log-probs of every pair."""
    out = torch.empty(len(dataset), 2, dtype=torch.float32)
    done = 0
    for rows, n in chunks(len(dataset), size, world_size):
        out[rows[0]:rows[0] + n] = model.compute_ref_logps(dataset.get_batch(rows))["ref_logps"][:n]
        done += n
        progress(f"reference log-probs ({name} pairs)", done, len(dataset))
    return out


@dataclass
class StoredReference:
    """The reference's completion log-probs per pair (8 bytes a pair, on the driver), by dataset row."""

    train: torch.Tensor  # (N, 2): chosen, rejected
    val: torch.Tensor | None
    seconds: float

    @classmethod
    def compute(cls, model: Any, train: Any, val: Any, size: int, world_size: int,
                progress: Progress) -> StoredReference:
        start = time.perf_counter()
        pairs = len(train) + (len(val) if val is not None else 0)
        log.warning("dpo.ref.precompute: scoring %d pairs with the reference once, before step 1", pairs)
        stored = score_pairs(model, train, size, world_size, progress, "training")
        held = score_pairs(model, val, size, world_size, progress, "validation") if val is not None else None
        return cls(stored, held, time.perf_counter() - start)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.train, self.val) if t is not None)
