"""Ctrl-C (or a scheduler's SIGTERM) during a run: stop cleanly and say in one line where the run stands
and how to go on.

A terminal's Ctrl-C reaches the whole foreground process group, so Ray's workers may die of it a
moment before the driver's own KeyboardInterrupt arrives; the driver then sees a worker failure.
`InterruptWatch` remembers that SIGINT was received, so such a failure is reported as the
interruption it is, not as a crash with a traceback. SIGTERM (`kill`, Slurm, Kubernetes) takes the
same path; `ray.init()` installs a C++ failure handler for SIGTERM that prints stack dumps and exits
without our shutdown, so the watch is re-armed after Ray starts (`rearm`).

A signal handler runs between two bytecodes of the main thread, which may be inside a finalizer (`__del__`, a
weakref callback); Python drops an exception raised there ("Exception ignored in ...") and the run would go on.
The watch sees such a drop through `sys.unraisablehook` and delivers the interrupt again (`_thread.interrupt_main`
from a helper thread), so it lands at an ordinary bytecode after the finalizer: a Ctrl-C at any moment stops the
run, once. Library code that swallows a KeyboardInterrupt outright (a bare `except:`) is caught up with at safe
points: a nested watch starts, and every training step begins, with `raise_if_interrupted()`.
"""

from __future__ import annotations

import _thread
import shlex
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any


class TrainingInterrupted(Exception):
    """The run was stopped by Ctrl-C; carries the step it was in and the last complete checkpoint."""

    def __init__(self, step: int | None, total: int | None, checkpoint: Path | None,
                 signum: int = signal.SIGINT) -> None:
        self.step, self.total, self.checkpoint, self.signum = step, total, checkpoint, signum
        super().__init__(self.line())

    @property
    def exit_code(self) -> int:
        """128 + the signal, the shell's convention: 130 for Ctrl-C, 143 for SIGTERM."""
        return 128 + int(self.signum)

    def line(self, command: Sequence[str] | None = None) -> str:
        """The one line printed for the user; with `command` (the argv that started the run) it ends
        with the exact command that resumes (or, without a checkpoint, restarts) the run."""
        if self.step is None:
            where = "interrupted before training started"
        elif self.step == 0:
            where = "interrupted before the first step"
        else:
            where = f"interrupted at step {self.step}" + (f" of {self.total}" if self.total else "")
        if self.signum != signal.SIGINT:
            where += f" by {signal.Signals(self.signum).name}"
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


WATCHED_SIGNALS = (signal.SIGINT, signal.SIGTERM)
REDELIVER_AFTER_S = 0.05  # a dropped interrupt comes back this much later, after the finalizer that dropped it


class InterruptWatch:
    """Within the block, SIGINT and SIGTERM raise KeyboardInterrupt (as Python's default does for SIGINT) and
    are remembered (`hit`, `signum`); one that a finalizer swallowed is raised again outside it."""

    def __init__(self) -> None:
        self.hit = False
        self.signum: int = signal.SIGINT
        self._previous: dict[int, Any] = {}
        self._previous_hook: Any = None
        self._stopping = False
        self._in_hook = False

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        if not self.hit:  # the first signal names the stop (a SIGINT after a SIGTERM is still a SIGTERM stop)
            self.signum = signum
        self.hit = True
        if self._stopping:
            return
        if self._in_hook:  # inside our own unraisable hook: an exception here would be dropped as well
            self._deliver_later()
            return
        raise KeyboardInterrupt

    def _deliver_later(self) -> None:
        """Run the handler again in the main thread in a moment (from a helper thread, once this frame is left)."""
        def deliver() -> None:
            time.sleep(REDELIVER_AFTER_S)
            _thread.interrupt_main(self.signum)

        threading.Thread(target=deliver, name="rlkit-interrupt", daemon=True).start()

    def stopping(self) -> None:
        """The run is shutting down: later signals are remembered but interrupt nothing (stop once, fully)."""
        self._stopping = True

    def _unraisable(self, unraisable: Any) -> None:
        """A KeyboardInterrupt of ours dropped by a finalizer: deliver it again, silently; others as before."""
        if self.hit and isinstance(unraisable.exc_value, KeyboardInterrupt):
            if not self._stopping:
                self._in_hook = True
                try:
                    self._deliver_later()
                finally:
                    self._in_hook = False
            return
        (self._previous_hook or sys.__unraisablehook__)(unraisable)

    def rearm(self) -> None:
        """Install the handlers again: call after a library (Ray) replaced them at the C level."""
        if self._previous and threading.current_thread() is threading.main_thread():
            for signum in WATCHED_SIGNALS:
                signal.signal(signum, self._handler)

    def __enter__(self) -> InterruptWatch:
        raise_if_interrupted()  # an outer watch's signal that something swallowed
        if threading.current_thread() is threading.main_thread():
            self._previous = {signum: signal.signal(signum, self._handler) for signum in WATCHED_SIGNALS}
            self._previous_hook, sys.unraisablehook = sys.unraisablehook, self._unraisable
            _ACTIVE.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        if self._previous:
            sys.unraisablehook = self._previous_hook
            _ACTIVE.remove(self)


_ACTIVE: list[InterruptWatch] = []  # the watches in force, outermost first (signals are the process's, so is this)


def raise_if_interrupted() -> None:
    """A safe point: raise KeyboardInterrupt if a watch in force got a signal whose interrupt was swallowed."""
    if any(w.hit and not w._stopping for w in _ACTIVE):
        raise KeyboardInterrupt
