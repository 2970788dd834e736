"""Run a coroutine to completion from sync code: the judge's HTTP requests, the served teacher's and the agent loop's
turns are asyncio code called from the trainer's (or a worker's) plain methods."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


def run_coroutine(coro: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(coro)`, also from a thread that already runs an event loop (then on a helper thread, whose
    exception is raised here)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlkit-async") as pool:
        return pool.submit(asyncio.run, coro).result()
