"""Resource pools: processes per node, backed by one Ray placement group per node.

A pool of several nodes takes distinct nodes, each pinned by its Ray node-id label, chosen in a stable
order (node IP, then node id) among the live nodes with room for the node's processes: `trainer.nnodes=2`
means two machines, never two bundle sets packed on one. Ranks follow the same order (placement groups
sorted by node IP, then node id), so a restarted run puts rank r on the same node and sharded checkpoints
reload onto the rank that wrote them.
"""

from __future__ import annotations

import time
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
    avoid_nodes: set[str] = field(default_factory=set)  # nodes another pool of the run holds (own nodes asked)
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
        nodes: list[str | None] = [None] * len(self.process_on_nodes)
        if len(self.process_on_nodes) > 1 or self.avoid_nodes:
            nodes = list(pick_nodes(self.process_on_nodes, self.bundle(), self.name, self.ready_timeout_s,
                                    self.avoid_nodes))
        pgs = [
            placement_group([self.bundle()] * n, strategy="STRICT_PACK", name=f"{self.name}_node{i}",
                            bundle_label_selector=[{NODE_LABEL: node}] * n if node else None)
            for i, (n, node) in enumerate(zip(self.process_on_nodes, nodes))
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


NODE_LABEL = "ray.io/node-id"  # the label Ray gives every node: its id


def pick_nodes(process_on_nodes: list[int], bundle: dict[str, float], name: str, wait_s: float = 30.0,
               avoid: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """Distinct live nodes, one per entry of `process_on_nodes`, each with room for that many `bundle`s, in
    (IP, node id) order; waits up to `wait_s` for room (groups just stopped free theirs a moment later), then
    UserError naming the shortfall."""
    deadline = time.monotonic() + min(wait_s, 30.0)
    while True:
        try:
            return _pick_nodes_now(process_on_nodes, bundle, name, avoid)
        except UserError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1.0)


def _pick_nodes_now(process_on_nodes: list[int], bundle: dict[str, float], name: str,
                    avoid: set[str] | frozenset[str]) -> list[str]:
    alive = [n for n in ray.nodes() if n.get("Alive") and n["NodeID"] not in avoid]
    nodes = sorted(alive, key=lambda n: _ip_key(n["NodeManagerAddress"], n["NodeID"]))
    free = _available_per_node()
    chosen: list[str] = []
    for need in process_on_nodes:
        for node in nodes:
            room = free.get(node["NodeID"], node.get("Resources", {}))
            if node["NodeID"] not in chosen and all(room.get(k, 0.0) >= v * need for k, v in bundle.items()):
                chosen.append(node["NodeID"])
                break
        else:
            have = ", ".join(f"{n['NodeManagerAddress']} ({n['NodeID'][:8]}): "
                             f"{_fmt(free.get(n['NodeID'], n.get('Resources', {})), bundle)}" for n in nodes)
            raise UserError(
                f"resource pool '{name}' needs {len(process_on_nodes)} nodes with {process_on_nodes} processes of "
                f"{bundle} each, but only {len(chosen)} of the cluster's {len(nodes)} live node(s) "
                f"{'not used by the trainer ' if avoid else ''}have room ({have}). "
                "Join more nodes (`rlkit cluster join`), or lower trainer.nnodes / trainer.n_gpus_per_node."
            )
    return chosen


def _available_per_node() -> dict[str, dict[str, float]]:
    """Each live node's free resources now (Ray's per-node view; {} where this Ray lacks it: totals are used)."""
    try:
        from ray._private.state import available_resources_per_node  # no public per-node view in Ray 2.x

        return available_resources_per_node()
    except Exception:
        return {}


def _fmt(room: dict[str, float], bundle: dict[str, float]) -> str:
    return ", ".join(f"{k} {room.get(k, 0.0):g}" for k in bundle)


def _ip_key(ip: str, node_id: str) -> tuple[tuple[int, ...] | str, str]:
    try:
        return tuple(int(p) for p in ip.split(".")), node_id
    except ValueError:
        return ip, node_id


def _pg_node(pg: PlacementGroup) -> tuple[str, str]:
    table = placement_group_table(pg)
    node_id = next(iter(table["bundles_to_node_id"].values()))
    ip = next((n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == node_id), "")
    return ip, node_id


def _node_sort_key(pg: PlacementGroup) -> tuple[tuple[int, ...] | str, str]:
    return _ip_key(*_pg_node(pg))
