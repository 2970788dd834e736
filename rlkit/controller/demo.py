"""A short, real demo of the runtime: two Ray workers, a gloo all-reduce and a dispatched batch.

Run: `python -m rlkit.controller.demo`
"""

from __future__ import annotations

import os
import time

import torch
from rich.console import Console
from rich.table import Table

from rlkit.controller import ClassWithInitArgs, Dispatch, RayWorkerGroup, ResourcePool, Worker, register
from rlkit.protocol import Batch


class SquareWorker(Worker):
    @register(dispatch=Dispatch.DP_COMPUTE)
    def square(self, batch: Batch) -> Batch:
        start = time.perf_counter()
        y = batch["x"] ** 2
        return Batch(
            {"y": y, "rank": torch.full((len(batch),), self.rank), "pid": torch.full((len(batch),), os.getpid())},
            meta={"metrics": {"worker_s": time.perf_counter() - start}},
        )

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def all_reduce_sum(self) -> float:
        import torch.distributed as dist

        self.init_distributed()
        t = torch.tensor([float(self.rank + 1)])
        dist.all_reduce(t)
        return float(t.item())


def main() -> None:
    import ray

    console = Console()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    t0 = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    t_ray = time.perf_counter() - t0
    t0 = time.perf_counter()
    group = RayWorkerGroup(ResourcePool([2], cpus_per_process=1, name="demo"), ClassWithInitArgs(SquareWorker))
    t_spawn = time.perf_counter() - t0
    t0 = time.perf_counter()
    sums = group.all_reduce_sum()
    t_reduce = time.perf_counter() - t0
    batch = Batch({"x": torch.arange(7, dtype=torch.float32)})
    t0 = time.perf_counter()
    out = group.square(batch)
    t_dispatch = time.perf_counter() - t0

    table = Table(title="DP_COMPUTE: 7 rows over 2 workers (padded to 8, unpadded on return)")
    for col in ("row", "x", "x^2", "rank", "pid"):
        table.add_column(col, justify="right")
    for i in range(len(out)):
        cells = (batch["x"][i], out["y"][i], out["rank"][i], out["pid"][i])
        table.add_row(str(i), *(f"{float(c):.0f}" for c in cells))
    console.print(table)
    timing = Table(title="timings")
    timing.add_column("phase")
    timing.add_column("seconds", justify="right")
    for name, sec in [
        ("ray.init", t_ray),
        ("spawn 2 workers", t_spawn),
        (f"gloo all_reduce (result {sums})", t_reduce),
        ("dispatch + collect", t_dispatch),
    ]:
        timing.add_row(name, f"{sec:.3f}")
    console.print(timing)
    group.shutdown()
    ray.shutdown()


if __name__ == "__main__":
    main()
