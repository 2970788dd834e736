"""Run a test body on N spawned processes joined in one gloo group, and collect each rank's verdict.

A worker is `worker(rank, store_path, payload, results)`: it joins the group through the file store at
`store_path`, runs its checks and puts `(rank, "ok")` or `(rank, "<error>")` on `results` (exceptions do
not cross processes, so the parent asserts on the strings).

A run that goes wrong fails within seconds and says where: a rank that dies without a verdict (killed, out
of memory) is named with its exit code, and ranks still running once another has failed or the time is up
print their Python stacks (faulthandler on SIGUSR1, into the test's captured stderr) before they are stopped.
A collective that waits longer than `COLLECTIVE_TIMEOUT` raises in the rank that waits.
"""

from __future__ import annotations

import contextlib
import datetime
import faulthandler
import os
import queue
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=5)
GRACE_S = 30.0  # how long the other ranks may take to report once one has failed


def run_on_gloo_workers(worker: Callable[..., None], payload: Any, tmp_path: Path, world: int = 2,
                        timeout_s: float = 540) -> None:
    """Spawn `world` ranks of `worker` (one OpenMP thread each: they share the machine) and assert all said ok.
    The default wait ends before the suite's pytest-timeout (600 s), so this report, stacks included, comes first."""
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
    want = {r: "ok" for r in range(world)}
    got: dict[int, str] = {}
    try:
        got = _collect(procs, results, timeout_s)
    finally:
        _stop(procs, patient=got == want)
    assert got == want, got


def _collect(procs: list[Any], results: Any, timeout_s: float) -> dict[int, str]:
    """Each rank's verdict; a rank that died silently, or is still running when the wait ends, gets one too."""
    got: dict[int, str] = {}
    deadline = time.monotonic() + timeout_s
    while len(got) < len(procs) and time.monotonic() < deadline:
        try:
            rank, verdict = results.get(timeout=1.0)
            got[rank] = verdict
            if verdict != "ok":
                deadline = min(deadline, time.monotonic() + GRACE_S)
            continue
        except queue.Empty:
            pass
        for rank, p in enumerate(procs):
            if rank not in got and p.exitcode is not None:
                with contextlib.suppress(queue.Empty):  # its verdict may still be in the pipe
                    late_rank, verdict = results.get(timeout=2.0)
                    got[late_rank] = verdict
                if rank not in got:
                    got[rank] = f"died without a verdict, exit code {p.exitcode}"
                    deadline = min(deadline, time.monotonic() + GRACE_S)
    for rank, p in enumerate(procs):
        if rank not in got:
            got[rank] = f"no verdict after the wait (stack printed to stderr; alive: {p.is_alive()})"
            if p.is_alive() and p.pid:
                print(f"--- rank {rank} (pid {p.pid}), still running:", file=sys.stderr, flush=True)
                os.kill(p.pid, signal.SIGUSR1)
                time.sleep(1.0)  # one rank's stack at a time
    return got


def _stop(procs: list[Any], patient: bool) -> None:
    """End the ranks: ones that all said ok get a minute to leave the group; otherwise the stragglers get two
    seconds to print their stacks, then are killed (a hung rank must not outlive its test)."""
    for p in procs:
        p.join(timeout=60 if patient else 2)
        if p.is_alive():
            p.kill()
            p.join(timeout=10)


@contextlib.contextmanager
def gloo_rank(rank: int, store_path: str, results: Any, world: int = 2) -> Iterator[None]:
    """Inside a worker: join the group (one thread), run the block, report `(rank, "ok")` or the error with its
    traceback to the parent, leave the group. The block's exception is reported, not raised."""
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world,
                            timeout=COLLECTIVE_TIMEOUT)
    try:
        yield
        results.put((rank, "ok"))
    except BaseException as exc:  # report to the parent, which asserts
        results.put((rank, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-1500:]}"))
    finally:
        dist.destroy_process_group()
