"""Ctrl-C during a run: stop cleanly and say in one line where the run stands and how to go on.

A terminal's Ctrl-C reaches the whole foreground process group, so Ray's workers may die of it a
moment before the driver's own KeyboardInterrupt arrives; the driver then sees a worker failure.
`InterruptWatch` remembers that SIGINT was received, so such a failure is reported as the
interruption it is, not as a crash with a traceback.
"""

from __future__ import annotations

import shlex
import signal
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any


class TrainingInterrupted(Exception):
    """The run was stopped by Ctrl-C; carries the step it was in and the last complete checkpoint."""

    def __init__(self, step: int | None, total: int | None, checkpoint: Path | None) -> None:
        self.step, self.total, self.checkpoint = step, total, checkpoint
        super().__init__(self.line())

    def line(self, command: Sequence[str] | None = None) -> str:
        """The one line printed for the user; with `command` (the argv that started the run) it ends
        with the exact command that resumes (or, without a checkpoint, restarts) the run."""
        if self.step is None:
            where = "interrupted before training started"
        elif self.step == 0:
            where = "interrupted before the first step"
        else:
            where = f"interrupted at step {self.step}" + (f" of {self.total}" if self.total else "")
        if self.checkpoint is None:
            text = f"{where}; no checkpoint saved yet"
            return text + (f"; start again with: {rerun_command(command, resume=False)}" if command else "")
        text = f"{where}; last complete checkpoint: {self.checkpoint}"
        return text + (f"; resume with: {rerun_command(command, resume=True)}" if command else "")


def rerun_command(argv: Sequence[str], resume: bool) -> str:
    """`argv` as a shell command (program shown as `rlkit` unless it was started by a path to rlkit),
    with any trainer.resume_mode override replaced by `trainer.resume_mode=auto` when resuming."""
    prog = argv[0] if argv and Path(argv[0]).name == "rlkit" else "rlkit"
    args = [a for a in argv[1:] if not (resume and a.startswith("trainer.resume_mode="))]
    return shlex.join([prog, *args, *(["trainer.resume_mode=auto"] if resume else [])])


class InterruptWatch:
    """Within the block, SIGINT still raises KeyboardInterrupt (as Python's default does) and is remembered."""

    def __init__(self) -> None:
        self.hit = False
        self._previous: Any = None

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        self.hit = True
        raise KeyboardInterrupt

    def __enter__(self) -> InterruptWatch:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handler)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
