"""A simulated two-node Ray cluster on one machine: one worker per node, stable rank order."""

from __future__ import annotations

import ray
from ray.cluster_utils import Cluster

from rlkit.controller import ClassWithInitArgs, RayWorkerGroup, ResourcePool
from tests.controller.workers_for_tests import Doubler


def test_two_nodes_one_worker_each_in_stable_order():
    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    cluster.add_node(num_cpus=1)
    try:
        ray.init(address=cluster.address, log_to_driver=False)
        orders = []
        for attempt in range(2):
            pool = ResourcePool([1, 1], name=f"mn{attempt}")
            group = RayWorkerGroup(pool, ClassWithInitArgs(Doubler))
            where = group.where()
            nodes = [w["node_id"] for w in where]
            assert len(set(nodes)) == 2, where
            assert [w["rank"] for w in where] == [0, 1]
            assert group.all_reduce(1.0) == [3.0, 3.0]
            orders.append(nodes)
            group.shutdown()
            pool.release()
        assert orders[0] == orders[1] == sorted(orders[0])
    finally:
        ray.shutdown()
        cluster.shutdown()
