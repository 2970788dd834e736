"""Learning-rate schedules after warmup, looked up by `optim.lr_scheduler_type`.

Each is `fn(progress, min_lr_ratio) -> factor of the peak lr`, progress in [0, 1] from the end of
warmup to the last step; warmup itself (linear) is the same for all (`lr_lambda`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from rlkit.registry import Registry

Schedule = Callable[[float, float], float]

#: name -> fn(progress, min_lr_ratio) -> lr factor
LR_SCHEDULES: Registry[Schedule] = Registry("lr schedule")


@LR_SCHEDULES.register("constant")
def constant(progress: float, min_lr_ratio: float) -> float:
    return 1.0


@LR_SCHEDULES.register("cosine")
def cosine(progress: float, min_lr_ratio: float) -> float:
    """Half a cosine from the peak down to min_lr_ratio x peak at the last step."""
    return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def lr_lambda(optim: Any, total_steps: int) -> Callable[[int], float]:
    """Linear warmup (`lr_warmup_steps`, or `lr_warmup_steps_ratio` of the steps), then the registered schedule."""
    warmup = optim.lr_warmup_steps if optim.lr_warmup_steps >= 0 else int(optim.lr_warmup_steps_ratio * total_steps)
    schedule = LR_SCHEDULES.get(optim.lr_scheduler_type)

    def fn(step: int) -> float:
        if warmup > 0 and step < warmup:
            return (step + 1) / warmup
        return schedule(min(1.0, (step - warmup) / max(1, total_steps - warmup)), optim.min_lr_ratio)

    return fn
