"""Bounded staleness for fully asynchronous training: how many samples the pump may start, and which the trainer takes.

Versions: the policy after `v` updates is version `v`; the engine holds the version pushed last
(`v` = the number of weight pushes queued before a request). Step `k` (1-based) trains the policy
of version `k - 1`, so a sample whose generation started under version `v` and is trained at step
`k` is `(k - 1) - v` versions stale. `trainer.staleness_threshold` = s bounds that lag.

Two rules keep it, both pure arithmetic here (no Ray, unit-tested on handmade versions):

* admission (`StalenessBudget.may_start`): the pump starts a chunk under version `v` only while the
  samples started so far (dropped ones not counted) stay within `batch * (v + 1 + s)`. The trainer
  consumes `batch` samples per step, oldest first, so every sample started under `v` is among the
  first `batch * (v + 1 + s)` and is trained by step `v + 1 + s` at the latest: lag <= s.
  With s = 0 the pump never runs ahead of the trainer (on-policy, synchronous in effect).
* taking (`SampleBuffer.take`): the trainer takes `batch` finished samples, oldest version first
  (whole chunks, so GRPO groups stay whole). Chunks finish out of order (long responses), so a
  younger chunk could be trained in the place of an older one still generating, which would then
  be too old for a later step; the buffer knows the chunks in flight (`begin`) and waits for an
  older chunk instead of taking younger ones whenever taking them would leave it no step to be
  trained in (earliest deadline first, `feasible_after`). A sample that still comes out too old
  (a chunk that never reached the buffer in time) is dropped and counted
  (`rollout/dropped_stale`), and its slot in the budget is freed so the pump starts another.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any


def staleness(trained_version: int, sample_version: int) -> int:
    """How many versions the policy being updated (`trained_version`) is ahead of the sample's."""
    return trained_version - sample_version


@dataclass
class StalenessBudget:
    """How many samples the pump may have started (in flight, buffered or trained) at each engine version."""

    batch: int  # samples per training step (train_batch_size x rollout.n)
    threshold: int  # trainer.staleness_threshold
    total: int | None = None  # samples the whole run trains (None: no end)
    started: int = 0  # samples started and not dropped

    def limit(self, version: int) -> int:
        cap = self.batch * (version + 1 + self.threshold)
        return cap if self.total is None else min(cap, self.total)

    def may_start(self, size: int, version: int) -> bool:
        return self.started + size <= self.limit(version)

    def start(self, size: int) -> None:
        self.started += size

    def release(self, size: int) -> None:
        """Dropped samples free their slots (the pump starts others in their place)."""
        self.started -= size


@dataclass(order=True)
class Finished:
    """A finished chunk in the buffer: whole groups, generated from `version` on (its oldest token's)."""

    version: int
    seq: int  # start order: ties in version go first-started first
    size: int = field(compare=False)
    payload: Any = field(compare=False, default=None)


@dataclass
class Taken:
    items: list[Finished]
    dropped: list[Finished]

    @property
    def dropped_samples(self) -> int:
        return sum(item.size for item in self.dropped)


class SampleBuffer:
    """Finished chunks waiting for the trainer (not thread-safe: the pump's lock guards it)."""

    def __init__(self, threshold: int) -> None:
        self.threshold = threshold
        self._heap: list[Finished] = []
        self._running: dict[int, tuple[int, int]] = {}  # seq -> (version, size) of the chunks still generating

    def begin(self, version: int, seq: int, size: int) -> None:
        """A chunk started generating under `version` (it must train a version <= version + threshold)."""
        self._running[seq] = (version, size)

    def __len__(self) -> int:
        return sum(item.size for item in self._heap)

    def add(self, item: Finished) -> None:
        self._running.pop(item.seq, None)
        heapq.heappush(self._heap, item)

    def feasible_after(self, taken: list[Finished], batch: int, trained_version: int) -> bool:
        """Whether every chunk left (buffered or still generating) can still be trained in time if `taken` trains
        `trained_version` now: at most `batch * j` samples may be due within the next j steps."""
        chosen = {item.seq for item in taken}
        left = [(item.version, item.size) for item in self._heap if item.seq not in chosen]
        left += [(version, size) for version, size in self._running.values()]
        count = 0
        for version, size in sorted(left):
            count += size
            steps_left = version + self.threshold - trained_version  # the next steps that may still train it
            if count > batch * steps_left:
                return False
        return True

    def drop_stale(self, trained_version: int) -> list[Finished]:
        """Remove (and return) the chunks too old to train the policy of `trained_version`."""
        dropped = []
        while self._heap and staleness(trained_version, self._heap[0].version) > self.threshold:
            dropped.append(heapq.heappop(self._heap))
        return dropped

    def take(self, batch: int, trained_version: int) -> Taken:
        """Drop what is too old for `trained_version` (`Taken.dropped`), then take `batch` samples oldest first
        (`Taken.items`; empty, leaving the buffer as it is, while fewer than `batch` are ready or taking them
        now would leave an older chunk still generating no step to train in: earliest deadline first)."""
        dropped = self.drop_stale(trained_version)
        if len(self) < batch:
            return Taken([], dropped)
        items, count = [], 0
        for item in sorted(self._heap):
            if count + item.size > batch:  # chunks divide the batch (checked by the config); never split a group
                break
            items.append(item)
            count += item.size
        if not self.feasible_after(items, batch, trained_version):
            return Taken([], dropped)
        chosen = {item.seq for item in items}
        self._heap = [item for item in self._heap if item.seq not in chosen]
        heapq.heapify(self._heap)
        return Taken(items, dropped)
