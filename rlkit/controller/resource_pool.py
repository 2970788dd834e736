"""Resource pools: processes per node, backed by one Ray placement group per node.

Ranks are assigned in a stable order (placement groups sorted by node IP, then
node id), so a restarted run puts rank r on the same node and sharded
checkpoints reload onto the rank that wrote them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import ray
from ray.util.placement_group import PlacementGroup, placement_group, placement_group_table

from rlkit.errors import UserError


@dataclass
class ResourcePool:
    """`process_on_nodes=[2, 2]` = two nodes with two worker processes each."""

    process_on_nodes: list[int]
    use_gpu: bool = False
    cpus_per_process: float = 1.0
    name: str = "pool"
    ready_timeout_s: float = 120.0
    _pgs: list[PlacementGroup] | None = field(default=None, repr=False)

    @property
    def world_size(self) -> int:
        return sum(self.process_on_nodes)

    def bundle(self) -> dict[str, float]:
        b = {"CPU": self.cpus_per_process}
        if self.use_gpu:
            b["GPU"] = 1.0
        return b

    def placement_groups(self) -> list[PlacementGroup]:
        """Create (once) and return the node placement groups in stable rank order."""
        if self._pgs is not None:
            return self._pgs
        pgs = [
            placement_group([self.bundle()] * n, strategy="STRICT_PACK", name=f"{self.name}_node{i}")
            for i, n in enumerate(self.process_on_nodes)
        ]
        ready = [pg.ready() for pg in pgs]
        done, pending = ray.wait(ready, num_returns=len(ready), timeout=self.ready_timeout_s)
        if pending:
            for pg in pgs:
                ray.util.remove_placement_group(pg)
            need = {k: v * self.world_size for k, v in self.bundle().items()}
            raise UserError(
                f"resource pool '{self.name}' could not be placed within {self.ready_timeout_s:.0f}s: "
                f"it needs {self.process_on_nodes} processes per node ({need} in all) but the cluster has "
                f"{ray.available_resources()}. Lower trainer.n_gpus_per_node / trainer.nnodes or add nodes."
            )
        self._pgs = sorted(pgs, key=_node_sort_key)
        return self._pgs

    def release(self) -> None:
        for pg in self._pgs or []:
            ray.util.remove_placement_group(pg)
        self._pgs = None


def _pg_node(pg: PlacementGroup) -> tuple[str, str]:
    table = placement_group_table(pg)
    node_id = next(iter(table["bundles_to_node_id"].values()))
    ip = next((n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == node_id), "")
    return ip, node_id


def _node_sort_key(pg: PlacementGroup) -> tuple[tuple[int, ...] | str, str]:
    ip, node_id = _pg_node(pg)
    try:
        ip_key: tuple[int, ...] | str = tuple(int(p) for p in ip.split("."))
    except ValueError:
        ip_key = ip
    return ip_key, node_id
