"""Run a test body on N spawned processes joined in one gloo group, and collect each rank's verdict.

A worker is `worker(rank, store_path, payload, results)`: it joins the group through the file store at
`store_path`, runs its checks and puts `(rank, "ok")` or `(rank, "<error>")` on `results` (exceptions do
not cross processes, so the parent asserts on the strings).
"""

from __future__ import annotations

import contextlib
import os
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def run_on_gloo_workers(worker: Callable[..., None], payload: Any, tmp_path: Path, world: int = 2,
                        timeout_s: float = 600) -> None:
    """Spawn `world` ranks of `worker` (one OpenMP thread each: they share the machine) and assert all said ok."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, str(tmp_path / "store"), payload, results)) for r in range(world)]
    before = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"  # the spawned ranks inherit it; this process gets its own value back
    try:
        for p in procs:
            p.start()
    finally:
        if before is None:
            del os.environ["OMP_NUM_THREADS"]
        else:
            os.environ["OMP_NUM_THREADS"] = before
    got = dict(results.get(timeout=timeout_s) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    assert got == {r: "ok" for r in range(world)}, got


@contextlib.contextmanager
def gloo_rank(rank: int, store_path: str, results: Any, world: int = 2) -> Iterator[None]:
    """Inside a worker: join the group (one thread), run the block, report `(rank, "ok")` or the error with its
    traceback to the parent, leave the group. The block's exception is reported, not raised."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world)
    try:
        yield
        results.put((rank, "ok"))
    except BaseException as exc:  # report to the parent, which asserts
        results.put((rank, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-1500:]}"))
    finally:
        dist.destroy_process_group()
