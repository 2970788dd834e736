"""A long wait the user should see is still moving: a spinner on a terminal, a line every few seconds in a log file.

Start-up (Ray, model load, FSDP, the rollout engine) takes tens of seconds before the first step prints; a log file
(a batch job, `> run.log`) would otherwise show nothing in that time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rlkit.utils.console_tracker import PROGRESS_EVERY_S


@contextmanager
def waiting(console: Any, text: str, every_s: float = PROGRESS_EVERY_S) -> Iterator[None]:
    """Within the block: rich's spinner with `text` on a terminal; otherwise `text` now and `text Ns` every
    `every_s` seconds until the block ends."""
    if console.is_terminal:
        with console.status(text):
            yield
        return
    console.print(text, markup=False, highlight=False, soft_wrap=True)
    start, done = time.monotonic(), threading.Event()

    def tick() -> None:
        while not done.wait(every_s):
            console.print(f"{text} {time.monotonic() - start:.0f}s", markup=False, highlight=False, soft_wrap=True,
                          style="dim")

    ticker = threading.Thread(target=tick, name="rlkit-status", daemon=True)
    ticker.start()
    try:
        yield
    finally:
        done.set()
        ticker.join()
