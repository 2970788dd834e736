"""What one training step returns (`RLTrainer.train_step`), typed: no private keys riding in the metrics.

Timing names: `timing_s/<phase>` is the driver's wall time of one phase of the step, `phases` here (the names
rlkit/phases.py declares). `gen` is the whole generation stage as the driver sees it, so it includes the reward
scoring (`reward`) and dynamic-sampling refills.
Workers time their own work under other names, so neither overwrites the other: the rollout
engine's generation is `timing_s/generate_sequences` (verl's name), a weight load into the
engine `timing_s/rollout_load_weights`.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rlkit.utils.once import Once

if TYPE_CHECKING:
    from rlkit.utils.flops import MFUMeter

log = logging.getLogger("rlkit.trainer")


def timing_key(phase: str) -> str:
    return f"timing_s/{phase}"


@dataclass
class StepResult:
    """One step: its metrics, the driver's phase times, and what `fit` turns into perf/throughput and perf/mfu."""

    metrics: dict[str, float]  # worker, data and algorithm metrics (none of them a phase's timing_s/<phase>)
    phases: dict[str, float] = field(default_factory=dict)  # phase -> driver wall seconds
    tokens: float = 0.0  # valid tokens (prompt + response) of the trained batch
    flops: float | None = None  # model FLOPs of the step's forward/backward passes; None = not counted

    def log_row(self, step_s: float, mfu: MFUMeter | None = None) -> dict[str, float]:
        """The metrics row of this step, `step_s` being its wall time: phases as timing_s/<phase>, timing_s/step,
        perf/throughput (tokens/s) and, given the meter, perf/mfu."""
        row = dict(self.metrics)
        for phase, seconds in self.phases.items():
            key = timing_key(phase)
            if key in row:  # a worker timed something under a phase's name: the driver's time wins
                if _WARNED.first(key):
                    log.warning("metric %s is both a worker's and the driver's phase timing; logging the driver's "
                                "(a worker's own timing needs another name)", key)
            row[key] = seconds
        row["timing_s/step"] = step_s
        row["perf/throughput"] = self.tokens / max(step_s, 1e-9)
        if mfu is not None and self.flops is not None:
            row["perf/mfu"] = mfu(self.flops, step_s)
        return row


_WARNED = Once()


class Timer:
    """`with timer("gen"):` accumulates the driver's seconds in phase `gen` (logged as `timing_s/gen`)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - start
