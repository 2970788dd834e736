"""The `rlkit` command line.

Run as the `rlkit` program, a Ctrl-C while its modules load (a second or more on a busy machine) exits 130 with
one line: Python's own KeyboardInterrupt there can be swallowed by an import and the command would then run on.
`rlkit_cli.main` hands SIGINT back to Python once its commands are registered (`end_loading_guard`).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from types import FrameType


def _interrupted_while_loading(signum: int, frame: FrameType | None) -> None:
    os.write(2, b"interrupted before the command started\n")  # os._exit flushes nothing
    os._exit(128 + signum)


def end_loading_guard() -> None:
    """Give SIGINT back to Python's default (KeyboardInterrupt): each command handles Ctrl-C its own way."""
    if signal.getsignal(signal.SIGINT) is _interrupted_while_loading:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def running_as_program() -> bool:
    """Whether this process is the `rlkit` program (not a test or a script that imported the CLI)."""
    return os.path.basename(sys.argv[0] if sys.argv else "") == "rlkit"


if running_as_program() and threading.current_thread() is threading.main_thread():
    signal.signal(signal.SIGINT, _interrupted_while_loading)
