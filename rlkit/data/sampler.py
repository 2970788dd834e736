"""A seeded, resumable batch order and the loader that turns it into Batches.

The order of epoch `e` is a pure function of (seed, e), so a checkpoint only needs
(epoch, position) to resume mid-epoch with exactly the batches a run would have
seen next. Single process: the dataset is pre-tokenized, a batch is just padding.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from rlkit.data.dataset import RLDataset
from rlkit.errors import UserError
from rlkit.protocol import Batch


class ResumableSampler:
    """Yields index arrays of `batch_size`; `position` counts batches handed out this epoch."""

    def __init__(self, num_rows: int, batch_size: int, shuffle: bool = True, seed: int = 0, drop_last: bool = True,
                 order_fn: Callable[[int], np.ndarray] | None = None):
        if batch_size <= 0:
            raise UserError(f"batch_size must be positive, got {batch_size}")
        if drop_last and num_rows < batch_size:
            raise UserError(
                f"the dataset has {num_rows} rows, fewer than batch_size={batch_size}; "
                "lower the batch size or set drop_last=False"
            )
        self.num_rows = num_rows
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.order_fn = order_fn  # a user's sampler (data.sampler): epoch -> the row order
        self.epoch = 0
        self.position = 0

    def __len__(self) -> int:
        full, rest = divmod(self.num_rows, self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def order(self, epoch: int) -> np.ndarray:
        """The row order of `epoch`, the same in every run with this seed (or the user sampler's, `order_fn`)."""
        if self.order_fn is not None:
            return self.order_fn(epoch)
        if not self.shuffle:
            return np.arange(self.num_rows)
        return np.random.default_rng([self.seed, epoch]).permutation(self.num_rows)

    def __iter__(self) -> Iterator[np.ndarray]:
        """The rest of the current epoch; the next `iter` starts the following one."""
        if self.position >= len(self):
            self.epoch, self.position = self.epoch + 1, 0
        order = self.order(self.epoch)
        while self.position < len(self):
            start = self.position * self.batch_size
            self.position += 1  # counted before the yield: a checkpoint taken now resumes after it
            yield order[start : start + self.batch_size]
        self.epoch, self.position = self.epoch + 1, 0

    _CHECKED = ("num_rows", "batch_size", "shuffle", "drop_last")

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed} | {
            k: getattr(self, k) for k in self._CHECKED
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume where `state` stopped; refuses a state saved for a different data layout."""
        changed = [
            f"{k} {state[k]} -> {getattr(self, k)}"
            for k in self._CHECKED
            if k in state and state[k] != getattr(self, k)
        ]
        if changed:
            raise UserError(
                f"cannot resume the data order: {', '.join(changed)} since the checkpoint; "
                "keep the data files and batch size of the run, or start without resuming"
            )
        self.seed = int(state.get("seed", self.seed))
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])


class RLDataLoader:
    """Iterates Batches over one epoch per `iter`; `len` is batches per epoch.

    `for batch in loader` continues mid-epoch after `load_state_dict`, so a resumed
    run sees the same remaining batches, in the same order, as the original.
    """

    def __init__(
        self, dataset: RLDataset, batch_size: int, shuffle: bool = True, seed: int = 0, drop_last: bool = True,
        order_fn: Callable[[int], np.ndarray] | None = None,
    ) -> None:
        self.dataset = dataset
        self.batch_size = batch_size
        self.sampler = ResumableSampler(len(dataset), batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last,
                                        order_fn=order_fn)

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Iterator[Batch]:
        for indices in self.sampler:
            yield self.dataset.get_batch(indices)

    @property
    def epoch(self) -> int:
        return self.sampler.epoch

    @property
    def position(self) -> int:
        return self.sampler.position

    def state_dict(self) -> dict[str, Any]:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state)
