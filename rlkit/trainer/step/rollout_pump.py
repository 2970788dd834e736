"""The rollout pump of fully asynchronous training: a driver thread that keeps the rollout group generating.

It owns the prompts (its own pass over the training loader), cuts them into chunks of
`trainer.rollout_chunk_prompts` prompts (whole groups of `rollout.n` samples), and keeps at most
`MAX_IN_FLIGHT` generation requests queued on the rollout group (non-blocking futures), so the
engine never idles and a weight push waits behind at most that many requests. A chunk is
generated in segments of `trainer.partial_rollout_segment` tokens (one segment of the whole
response when 0; rlkit/trainer/step/partial_rollout.py); unfinished chunks go first, new chunks start
only while `StalenessBudget` allows (rlkit/trainer/step/sample_buffer.py). Finished chunks go into the
`SampleBuffer`, which the trainer's thread empties one batch at a time (`take`).

Versions: `VersionClock.value` is the policy version the engines hold *for the next request*:
a weight push (`VersionedRoute.push`) queues `receive_weights` on the rollout workers and bumps
the clock under the same lock the pump holds when it queues a request, and Ray runs one caller's
calls to an actor in the order they were queued, so each request's version is exact. A push
therefore lands after the requests already queued (at most `MAX_IN_FLIGHT`): those finish under
the old weights (their tokens carry the old version), the next segment uses the new ones.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import ray

from rlkit.protocol import Batch
from rlkit.rollout.lifecycle import QueuedRoute, call_seed
from rlkit.trainer.step.partial_rollout import PartialChunk
from rlkit.trainer.step.sample_buffer import Finished, SampleBuffer, StalenessBudget, Taken

log = logging.getLogger("rlkit.trainer")
MAX_IN_FLIGHT = 2  # requests queued on the rollout group: one generating, one ready behind it
POLL_S = 0.05


@dataclass
class VersionClock:
    """The policy version of the next generation request, and the lock that orders requests and pushes."""

    value: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


class VersionedRoute:
    """A separate-engine route whose push also advances the clock, atomically with queueing the load."""

    def __init__(self, route: QueuedRoute, clock: VersionClock) -> None:
        self.route, self.clock = route, clock
        self.actor, self.rollout = route.actor, route.rollout

    def push(self, wait: bool = False) -> list[dict[str, float]]:
        self.route.collect()
        prepared = self.route.prepare()  # the gather, outside the lock: the pump goes on meanwhile
        with self.clock.lock:
            self.route.in_flight = self.route.queue(prepared)
            self.clock.value += 1
        return [self.route.collect() if wait else {}]

    def collect(self) -> dict[str, float]:
        return self.route.collect()

    def collect_if_done(self) -> dict[str, float]:
        return self.route.collect_if_done()

    def busy_groups(self) -> tuple[Any, ...]:
        return self.route.busy_groups()


@dataclass
class _Request:
    chunk: PartialChunk
    rows: list[int]
    version: int
    max_tokens: int
    future: Any


class RolloutPump:
    """See the module docstring. `start()` runs it in a daemon thread; `take()` is called by the trainer."""

    def __init__(
        self,
        rollout: Any,
        prompt_chunks: Iterator[Batch],
        new_chunk: Callable[[Batch], PartialChunk],
        clock: VersionClock,
        budget: StalenessBudget,
        buffer: SampleBuffer,
        segment: int,
    ) -> None:
        self.rollout, self.prompt_chunks, self.new_chunk = rollout, prompt_chunks, new_chunk
        self.clock, self.budget, self.buffer, self.segment = clock, budget, buffer, segment
        self.ready: deque[PartialChunk] = deque()  # chunks waiting for their next segment
        self.in_flight: list[_Request] = []
        self.cond = threading.Condition()  # guards buffer + budget; notified when a chunk finishes
        self.error: BaseException | None = None
        self.dropped_total = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._seq = 0
        self._next: Batch | None = None  # the prompts of the next chunk, drawn but not started yet

    # ------------------------------------------------------------------ thread
    def start(self) -> None:
        self.rollout.dispatch_info()  # cached once here, not raced for by two threads
        self._thread = threading.Thread(target=self._run, name="rlkit-rollout-pump", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._submit()
                self._wait_one()
        except BaseException as exc:  # surfaced by the trainer's next take()
            log.exception("rollout pump failed")
            with self.cond:
                self.error = exc
                self.cond.notify_all()

    def _submit(self) -> None:
        while len(self.in_flight) < MAX_IN_FLIGHT:
            with self.clock.lock:
                chunk = self.ready.popleft() if self.ready else self._new_chunk()
                if chunk is None:
                    return
                req, rows, max_tokens = chunk.request(self.segment)
                seed = call_seed(chunk.seq, chunk.segments)
                future = self.rollout.generate_sequences(req, seed=seed, response_length=max_tokens, blocking=False)
                self.in_flight.append(_Request(chunk, rows, self.clock.value, max_tokens, future))

    def _new_chunk(self) -> PartialChunk | None:
        """A new chunk if the budget allows one at the current version (caller holds the clock's lock)."""
        with self.cond:
            prompts = self._peek()
            if prompts is None or not self.budget.may_start(len(prompts), self.clock.value):
                return None
            self.budget.start(len(prompts))
            self.buffer.begin(self.clock.value, self._seq, len(prompts))
        self._next = None
        chunk = self.new_chunk(prompts)
        chunk.seq = self._seq
        self._seq += 1
        return chunk

    def _peek(self) -> Batch | None:
        if self._next is None:
            self._next = next(self.prompt_chunks, None)
        return self._next

    def _wait_one(self) -> None:
        if not self.in_flight:
            self._stop.wait(POLL_S)
            return
        refs = [ref for r in self.in_flight for ref in r.future.refs]
        ray.wait(refs, num_returns=1, timeout=POLL_S)
        for req in [r for r in self.in_flight if r.future.ready()]:
            self.in_flight.remove(req)
            out = req.future.get()
            req.chunk.add(req.rows, out, req.version, req.max_tokens)
            if not req.chunk.finished:
                self.ready.append(req.chunk)
                continue
            batch = req.chunk.assemble()
            batch.meta["metrics"] = out.meta.get("metrics", {})
            with self.cond:
                self.buffer.add(Finished(req.chunk.start_version, req.chunk.seq, len(batch), batch))
                self.cond.notify_all()

    # ------------------------------------------------------------------ trainer side
    def take(self, batch: int, trained_version: int) -> tuple[list[Batch], int]:
        """Block until `batch` samples fit to train the policy of `trained_version`; returns (their chunks,
        samples dropped as too stale meanwhile)."""
        dropped = 0
        with self.cond:
            while True:
                if self.error is not None:
                    raise RuntimeError("the rollout pump failed (see the log above)") from self.error
                taken: Taken = self.buffer.take(batch, trained_version)
                if taken.dropped:
                    self.budget.release(taken.dropped_samples)
                    dropped += taken.dropped_samples
                if taken.items:
                    self.dropped_total += dropped
                    return [item.payload for item in taken.items], dropped
                self.cond.wait(POLL_S * 10)
