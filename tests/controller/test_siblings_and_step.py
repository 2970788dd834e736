"""Colocated roles are handed to each other explicitly (`Sibling`), and every call carries the group's step."""

from __future__ import annotations

import pytest
import ray
import torch

from rlkit.controller import ClassWithInitArgs, RayWorkerGroup, ResourcePool, Sibling
from rlkit.protocol import Batch
from tests.controller.workers_for_tests import Consumer, Doubler, Weights


def test_sibling_is_the_role_of_the_same_process_and_calls_carry_the_step(ray_local):
    group = RayWorkerGroup(
        ResourcePool([2], cpus_per_process=0.5, name="sib"),
        {"weights": ClassWithInitArgs(Weights), "consumer": ClassWithInitArgs(Consumer, Sibling("weights"))},
    )
    try:
        weights, consumer = group.role("weights"), group.role("consumer")
        assert consumer.read() == [[0.0, 0.0], [1.0, 1.0]]  # each rank reads its own process's role
        weights.bump()
        assert consumer.read() == [[10.0, 10.0], [11.0, 11.0]]  # the same object, not a copy

        rows = Batch({"x": torch.zeros(4)})
        assert consumer.step_seen(rows)["step"].tolist() == [-1] * 4  # no step yet
        group.step = 7
        assert consumer.step_seen(rows)["step"].tolist() == [7] * 4
        future = consumer.step_seen(rows, blocking=False)  # the step is taken when the call is made
        group.step = 8
        assert future.get()["step"].tolist() == [7] * 4
        assert consumer.step_seen(rows)["step"].tolist() == [8] * 4
    finally:
        group.shutdown()
        group.pool.release()


def test_a_sibling_must_be_built_first(ray_local):
    pool = ResourcePool([1], cpus_per_process=0.5, name="sib-order")
    roles = {"consumer": ClassWithInitArgs(Consumer, Sibling("weights")), "weights": ClassWithInitArgs(Weights)}
    try:
        with pytest.raises(ray.exceptions.RayActorError, match="needs the role 'weights' built before it"):
            RayWorkerGroup(pool, roles)  # the worker process fails while building its roles
    finally:
        pool.release()


def test_the_host_trims_the_heap_when_another_phase_comes(monkeypatch):
    """A phase called again (SFT's train_batch, step after step) reuses the pages the last call freed: the host
    hands freed heap back to the OS only when another call comes, not between calls of the same phase."""
    from rlkit.controller import worker_group

    trims: list[str] = []
    host = worker_group._WorkerHost({}, {"doubler": ClassWithInitArgs(Doubler), "weights": ClassWithInitArgs(Weights)})
    monkeypatch.setattr(worker_group, "trim_heap", lambda: trims.append("trim"))
    rows = Batch({"x": torch.ones(2)})
    for role, method, args in [("doubler", "double", (rows,)), ("doubler", "double", (rows,)),
                               ("doubler", "seen_sizes", ()), ("doubler", "double", (rows,)),
                               ("weights", "bump", ()), ("weights", "bump", ())]:
        host.call(role, method, 1, *args)
        trims.append(f"{role}.{method}")
    assert trims == ["trim", "doubler.double", "doubler.double", "trim", "doubler.seen_sizes", "trim",
                     "doubler.double", "trim", "weights.bump", "weights.bump"]
    assert set(host.pop_memory_peaks()) == {"double", "seen_sizes", "bump"}  # every call still measured
