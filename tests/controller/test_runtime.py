"""The single-controller runtime on a real local Ray."""

from __future__ import annotations

import pytest
import torch

from rlkit.controller import ClassWithInitArgs, RayWorkerGroup, ResourcePool, WorkerError
from rlkit.protocol import Batch
from tests.controller.workers_for_tests import AddOne, Doubler, Holder, Reader, TPFollowers


def batch(n: int) -> Batch:
    return Batch({"x": torch.arange(n, dtype=torch.float32)}, {"tag": [f"r{i}" for i in range(n)]})


@pytest.fixture
def doublers(ray_local):
    group = RayWorkerGroup(ResourcePool([2], cpus_per_process=0.5, name="dbl"), ClassWithInitArgs(Doubler, scale=3.0))
    yield group
    group.shutdown()
    group.pool.release()


def test_dp_compute_uneven_batch_pads_and_unpads(doublers):
    out = doublers.double(batch(5))
    assert len(out) == 5
    assert out["y"].tolist() == [0.0, 3.0, 6.0, 9.0, 12.0]
    assert list(out["tag"]) == [f"r{i}" for i in range(5)]
    assert out["rank"].tolist() == [0, 0, 0, 1, 1]
    # each rank received 3 rows (5 padded to 6)
    assert doublers.seen_sizes() == [[3], [3]]


def test_one_to_all_rank_zero_all_to_all(doublers):
    assert doublers.whoami() == 0
    assert doublers.echo([10, 20]) == [(0, 10), (1, 20)]
    with pytest.raises(ValueError, match="one entry per worker"):
        doublers.echo([1])


def test_gloo_all_reduce(doublers):
    # rank r contributes value*(r+1): 1*1 + 1*2 = 3 on every rank
    assert doublers.all_reduce(1.0) == [3.0, 3.0]


def test_worker_error_names_rank_and_traceback(doublers):
    with pytest.raises(WorkerError) as info:
        doublers.explode(batch(4))
    err = info.value
    assert err.rank == 1 and err.method == "explode"
    assert "boom on purpose" in str(err) and "workers_for_tests.py" in str(err)


def test_futures_chain_between_groups_without_driver(ray_local):
    g1 = RayWorkerGroup(ResourcePool([2], cpus_per_process=0.5, name="g1"), ClassWithInitArgs(Doubler))
    g2 = RayWorkerGroup(ResourcePool([2], cpus_per_process=0.5, name="g2"), ClassWithInitArgs(AddOne))
    try:
        fut = g1.double(batch(5), blocking=False)
        fut2 = g2.add_one(fut, blocking=False)  # refs go worker -> worker
        out = fut2.get()
        assert out["y"].tolist() == [1.0, 3.0, 5.0, 7.0, 9.0]
        assert list(out["tag"]) == [f"r{i}" for i in range(5)]
    finally:
        for g in (g1, g2):
            g.shutdown()
            g.pool.release()


def test_future_rechunks_for_a_group_of_another_size(ray_local):
    g1 = RayWorkerGroup(ResourcePool([2], cpus_per_process=0.5, name="r1"), ClassWithInitArgs(Doubler))
    g2 = RayWorkerGroup(ResourcePool([1], cpus_per_process=0.5, name="r2"), ClassWithInitArgs(AddOne))
    try:
        out = g2.add_one(g1.double(batch(3), blocking=False))
        assert out["y"].tolist() == [1.0, 3.0, 5.0]
    finally:
        for g in (g1, g2):
            g.shutdown()
            g.pool.release()


def test_colocated_roles_share_a_process(ray_local):
    group = RayWorkerGroup(
        ResourcePool([2], cpus_per_process=0.5, name="colo"),
        {"holder": ClassWithInitArgs(Holder), "reader": ClassWithInitArgs(Reader)},
    )
    try:
        holder, reader = group.role("holder"), group.role("reader")
        assert holder.pid() == reader.pid()
        assert len(set(holder.pid())) == 2
        holder.bump()
        assert reader.read() == [[10.0] * 4, [11.0] * 4]
    finally:
        group.shutdown()
        group.pool.release()


def test_non_collector_outputs_dropped(ray_local):
    group = RayWorkerGroup(ResourcePool([2], cpus_per_process=0.5, name="tp"), ClassWithInitArgs(TPFollowers))
    try:
        out = group.tag(batch(3))
        # dp_size 1: the whole batch goes to both TP ranks; only rank 0 (the collector) is returned
        assert out["x"].tolist() == [0.0, 1.0, 2.0] and out["by"].tolist() == [0, 0, 0]
    finally:
        group.shutdown()
        group.pool.release()
