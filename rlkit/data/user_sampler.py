"""verl's `data.sampler.class_path` / `class_name`: the user's sampler decides the training rows' order.

As verl builds it: `cls(data_source=<the training dataset>, data_config=<the data section, as an OmegaConf
mapping>)`; each epoch's order is one pass of `iter(sampler)` (the loader still cuts it into generation batches,
seeded and counted as rlkit's own order is), and a curriculum sampler's `update(batch)` is called after every
training step with that step's batch (rlkit's Batch: `batch["token_level_scores"]`, `batch["uid"]`...).
A resumed run starts the interrupted epoch's order from a new pass of the sampler.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from rlkit.data.user_classes import load_user_object
from rlkit.errors import UserError
from rlkit.protocol import Batch

KEY = "data.sampler"


class UserSampler:
    """The user's sampler over `dataset`, giving rlkit's loader one epoch's row order at a time."""

    def __init__(self, class_path: str, class_name: str | None, dataset: Any, data_config: Any) -> None:
        from omegaconf import OmegaConf

        cls = load_user_object(class_path, class_name, KEY)
        section = dataclasses.asdict(data_config) if dataclasses.is_dataclass(data_config) else dict(data_config)
        self.num_rows = len(dataset)
        try:
            self.sampler = cls(data_source=dataset, data_config=OmegaConf.create(section))
        except TypeError as exc:
            raise UserError(f"{KEY}.class_name={class_name}: verl builds it as cls(data_source=, data_config=), "
                            f"which it does not take ({exc})") from None

    def order(self, epoch: int) -> np.ndarray:
        """One pass of the sampler: every row index once, in its order."""
        order = np.fromiter((int(i) for i in iter(self.sampler)), dtype=np.int64)
        if len(order) != self.num_rows or (len(order) and not 0 <= order.min() <= order.max() < self.num_rows):
            raise UserError(f"{KEY}: one pass of the sampler gave {len(order)} indices for {self.num_rows} rows; "
                            "rlkit's loader needs each row index once per epoch")
        return order

    def update(self, batch: Batch) -> None:
        """A curriculum sampler's hook after each step (verl's AbstractCurriculumSampler.update)."""
        update = getattr(self.sampler, "update", None)
        if callable(update):
            update(batch=batch)
