"""Results of non-blocking group calls.

A `DataFuture` holds one Ray object ref per contributing worker. Passing it to
another group's DP_COMPUTE method hands each rank its ref directly (Ray resolves
it inside the worker), so a batch flows rollout -> reward -> actor without the
driver ever materialising it. When the two groups have different data-parallel
sizes a small Ray task re-chunks the data, still off the driver.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import ray

from rlkit.protocol import Batch


class WorkerError(RuntimeError):
    """A worker method failed. Carries the rank and the worker's own traceback."""

    def __init__(self, group: str, rank: int, method: str, detail: str) -> None:
        self.group, self.rank, self.method, self.detail = group, rank, method, detail
        super().__init__(f"{group} rank {rank} failed in {method}:\n{detail}")


def get_with_rank(refs: list, ranks: list[int], group: str, method: str, timeout: float | None = None) -> list[Any]:
    """`ray.get` each ref, turning a worker failure into a WorkerError that names the rank.

    Results are taken as they finish, so the first rank that fails is reported at once: its peers may be waiting
    for it in a collective that never completes (a rank stopped by `--debug nan`, an exception on one rank)."""
    rank_of = {ref: rank for ref, rank in zip(refs, ranks)}
    values: dict[Any, Any] = {}
    pending = list(refs)
    deadline = None if timeout is None else time.monotonic() + timeout
    while pending:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready, pending = ray.wait(pending, num_returns=1, timeout=left)
        if not ready:  # past the timeout: ray.get raises its own GetTimeoutError
            ray.get(pending[0], timeout=0)
        for ref in ready:
            try:
                values[ref] = ray.get(ref)
            except ray.exceptions.RayTaskError as exc:
                raise WorkerError(group, rank_of[ref], method, str(exc)) from None
            except ray.exceptions.RayActorError as exc:
                raise WorkerError(group, rank_of[ref], method, f"the worker process died: {exc}") from None
    return [values[ref] for ref in refs]


def _rechunk(pad: int, n: int, *parts: Batch) -> tuple:
    batch = Batch.concat(list(parts)).unpad(pad)
    padded, new_pad = batch.pad_to_divisor(n)
    return (*padded.chunk(n), new_pad)


class DataFuture:
    """The pending result of a non-blocking call; `.get()` waits and collects it."""

    def __init__(
        self,
        refs: list,
        ranks: list[int],
        collect: Callable[[list[Any]], Any],
        group: str,
        method: str,
        pad: int = 0,
        timeout: float | None = None,
        side_refs: list | None = None,
        side_ranks: list[int] | None = None,
    ) -> None:
        self.refs, self.ranks, self._collect = refs, ranks, collect
        self.group, self.method, self.pad, self.timeout = group, method, pad, timeout
        # calls whose output is dropped (e.g. tensor-parallel followers): waited on so their errors still surface
        self.side_refs, self.side_ranks = side_refs or [], side_ranks or []

    def get(self) -> Any:
        values = get_with_rank(self.refs, self.ranks, self.group, self.method, self.timeout)
        get_with_rank(self.side_refs, self.side_ranks, self.group, self.method, self.timeout)
        return self._collect(values)

    def ready(self) -> bool:
        done, _ = ray.wait(self.refs, num_returns=len(self.refs), timeout=0)
        return len(done) == len(self.refs)

    def chunk_refs(self, n: int) -> tuple[list, int]:
        """Refs of `n` equal chunks of this (Batch-valued, DP) result, plus their padding."""
        if len(self.refs) == n:
            return list(self.refs), self.pad
        remote = ray.remote(_rechunk).options(num_returns=n + 1, num_cpus=0)
        refs = remote.remote(self.pad, n, *self.refs)
        return list(refs[:n]), ray.get(refs[n])
