"""A hang is named, not waited out: the driver's phases are watched, and one that makes no progress stops the run.

A run that stops making progress inside a collective (a rank waits in an all-reduce its peer never joins) or an
engine call would otherwise wait forever, or for the 30-minute collective timeout. `HangWatch` is a thread in the
driver: each phase of a step (`gen`, `update_actor`, ..., through `timer()`, and the loop's `step`, `validate`,
`save_checkpoint`) is entered and left through it, and each phase gets a limit of
`max(trainer.hang_timeout_s, HISTORY_FACTOR x its slowest time so far in this run)`; a phase that has not yet
finished once (compiles, caches warming, the first validation) gets FIRST_FACTOR x the floor. A phase open past its
limit:

1. every process's stack is read (the driver's own from Python, each worker's with `py-spy dump`, as
   `rlkit debug stacks` does: rlkit/debug/stacks.py);
2. each worker is named (group, rank) with the call it waits in: a collective (`all_reduce`, `broadcast`, ...
   from torch.distributed), an engine call (vLLM), or the rlkit frame it is in; a worker in none is idle;
3. the report goes to `<log dir>/hang_step<N>.txt`;
4. the workers are stopped, which ends the driver's wait, and the run stops with `HangStopped`: one line naming
   the phase, the waiting ranks, the report, and how to resume from the last complete checkpoint.
"""

from __future__ import annotations

import _thread
import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlkit.debug.stacks import Proc, dump, render
from rlkit.trainer.run.interrupt import TrainingInterrupted

log = logging.getLogger("rlkit.trainer")

HISTORY_FACTOR = 5.0  # a phase may take this many times its slowest time so far before it counts as hung
FIRST_FACTOR = 2.0  # a phase's first run may take this many times the floor
POLL_S = 1.0  # how often the thread looks (a hang is named within this of its limit)
INTERRUPT_AFTER_S = 15.0  # the driver is interrupted if it is still in the phase this long after the workers stop
# where a waiting process is: the first of these found in its stack, innermost first, names the call
COLLECTIVE_TAGS = ("torch/distributed/",)
ENGINE_TAGS = ("vllm/",)
WRAPPERS = ("wrapper", "inner", "decorate_context", "wrapped_fn")  # decorators' frames, never the call's name


@dataclass
class Waiter:
    """One worker process at the moment of the hang: who it is and what it waits in."""

    label: str
    pid: int
    rank: int | None
    kind: str  # "collective" | "engine call" | "in" | "idle" | "unreadable"
    where: str = ""  # "all_reduce (torch/distributed/distributed_c10d.py:2806)"
    called_from: str = ""  # the innermost rlkit frame outside the machinery

    def line(self) -> str:
        if self.kind == "idle":
            return f"{self.label}: idle (no call in progress)"
        if self.kind == "unreadable":
            return f"{self.label}: stack unreadable ({self.where})"
        via = f", called from {self.called_from}" if self.called_from and self.called_from != self.where else ""
        if self.kind == "in":  # no collective or engine call on its stack: where its own code is
            return f"{self.label}: in {self.where}{via}"
        return f"{self.label}: waits in {self.kind} {self.where}{via}"


def classify(proc: Proc) -> Waiter:
    """What a worker's stack says it waits in (innermost frame first)."""
    if proc.error:
        return Waiter(proc.label, proc.pid, proc.rank, "unreadable", proc.error)
    phase = proc.phase
    if not proc.frames or "rlkit/" not in phase or "rlkit/controller/" in phase:
        return Waiter(proc.label, proc.pid, proc.rank, "idle")
    for kind, tags in (("collective", COLLECTIVE_TAGS), ("engine call", ENGINE_TAGS)):
        # the outermost frame of the library: the call rlkit made (all_reduce), not the wrapper inside it
        inner = [f for f in proc.frames if any(t in f.rsplit("(", 1)[-1] for t in tags)]
        if inner:
            return Waiter(proc.label, proc.pid, proc.rank, kind, _first_public(inner), phase)
    return Waiter(proc.label, proc.pid, proc.rank, "in", proc.frames[-1], phase)


def _first_public(frames: list[str]) -> str:
    """The outermost frame of a library call whose function is public (skipping decorators' `wrapper`s)."""
    for frame in frames:
        func = frame.split(" (", 1)[0].rsplit(".", 1)[-1]
        if not func.startswith("_") and func not in WRAPPERS and not frame.startswith("_"):
            return frame
    return frames[0]


def driver_stack() -> Proc:
    """The driver's main-thread stack, from Python itself (py-spy cannot read its own parent everywhere)."""
    frame = sys._current_frames().get(threading.main_thread().ident)
    frames = [f"{fs.name} ({fs.filename}:{fs.lineno})" for fs in traceback.extract_stack(frame)] if frame else []
    return Proc(os.getpid(), "driver", frames=frames)


@dataclass
class HangReport:
    phase: str
    step: int
    seconds: float
    limit_s: float
    waiters: list[Waiter]
    path: Path | None = None

    def summary(self) -> str:
        busy = [w for w in self.waiters if w.kind not in ("idle",)]
        named = "; ".join(w.line() for w in (busy or self.waiters)) or "no worker processes"
        return (f"step {self.step} made no progress in phase '{self.phase}' for {self.seconds:.0f}s (limit "
                f"{self.limit_s:.0f}s, trainer.hang_timeout_s): {named}")


class HangStopped(TrainingInterrupted):
    """The run was stopped because a phase hung; the line names it and says how to resume."""

    def __init__(self, report: HangReport, total: int | None, checkpoint: Path | None) -> None:
        self.report = report
        super().__init__(report.step, total, checkpoint)

    @property
    def exit_code(self) -> int:
        return 1

    def line(self, command: Any = None) -> str:
        where = f"; stacks: {self.report.path}" if self.report.path else ""
        text = f"hang: {self.report.summary()}{where}"
        rest = super().line(command).split(";", 1)  # "interrupted at step N of M; last complete checkpoint: ..."
        return text + (";" + rest[1] if len(rest) > 1 else "")


@dataclass
class _Open:
    name: str
    started: float
    step: int


@dataclass
class HangWatch:
    """Watches the driver's open phases from a daemon thread (`start`/`stop`); `timeout_s` None or 0: off.

    `processes()` lists the run's worker processes as (pid, label, rank); `on_hang()` stops them (so the driver's
    wait ends); `step()` is the trainer's step now."""

    timeout_s: float | None
    log_dir: Path | None = None
    processes: Callable[[], list[tuple[int, str, int | None]]] = lambda: []
    on_hang: Callable[[], None] = lambda: None
    step: Callable[[], int] = lambda: 0
    factor: float = HISTORY_FACTOR
    slowest: dict[str, float] = field(default_factory=dict)
    fired: HangReport | None = None
    _open: list[_Open] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _thread: threading.Thread | None = None
    _stop: threading.Event = field(default_factory=threading.Event)

    @property
    def enabled(self) -> bool:
        return bool(self.timeout_s)

    def limit(self, name: str) -> float:
        """A phase's limit: the floor (twice it before the phase first finished), or a multiple of its slowest
        time so far when that is longer."""
        floor = float(self.timeout_s or 0)
        if name not in self.slowest:
            return FIRST_FACTOR * floor
        return max(floor, self.factor * self.slowest[name])

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        entry = _Open(name, time.monotonic(), self.step())
        with self._lock:
            self._open.append(entry)
        try:
            yield
        finally:
            with self._lock:
                self._open.remove(entry)
            if self.fired is None:
                self.slowest[name] = max(self.slowest.get(name, 0.0), time.monotonic() - entry.started)

    def watch(self, timer: Any) -> Any:
        """A step's timer (`Timer`, or one wrapping it) whose phases are also watched."""
        return _WatchedTimer(self, timer) if self.enabled else timer

    # ------------------------------------------------------------------ thread
    def start(self) -> HangWatch:
        if self.enabled and self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="rlkit-hang-watch", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self._thread = None

    def overdue(self) -> tuple[_Open, float, float] | None:
        """When an open phase is past its limit: (the innermost open phase, where the work stopped; the seconds
        it has been open; the limit that was passed), else None."""
        now = time.monotonic()
        with self._lock:
            for entry in self._open:
                limit = self.limit(entry.name)
                if now - entry.started > limit:
                    inner = self._open[-1]
                    return inner, now - inner.started, limit
        return None

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            late = self.overdue()
            if late is None:
                continue
            try:
                self.fire(*late)
            except Exception:  # the watch must never be what breaks a run
                log.exception("hang watch: naming the hang failed")
            return

    def fire(self, entry: _Open, seconds: float, limit: float) -> HangReport:
        """Name the hang (stacks -> report file), stop the workers, and make sure the driver leaves the phase."""
        procs = [driver_stack()] + [dump(pid, label, rank) for pid, label, rank in self.processes()]
        report = HangReport(entry.name, entry.step, seconds, limit, [classify(p) for p in procs[1:]])
        report.path = self._write(report, procs)
        self.fired = report
        log.error("hang: %s", report.summary())
        self.on_hang()
        deadline = time.monotonic() + INTERRUPT_AFTER_S
        while time.monotonic() < deadline and not self._stop.is_set():
            with self._lock:
                if entry not in self._open:
                    return report
            time.sleep(0.2)
        if not self._stop.is_set():
            _thread.interrupt_main()  # the driver is stuck in its own code: a KeyboardInterrupt ends the wait
        return report

    def _write(self, report: HangReport, procs: list[Proc]) -> Path | None:
        if self.log_dir is None:
            return None
        path = Path(self.log_dir) / f"hang_step{report.step}.txt"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            lines = [report.summary(), "", *(w.line() for w in report.waiters), "",
                     render(str(os.getpid()), procs)]
            path.write_text("\n".join(lines) + "\n")
        except OSError as exc:
            log.error("hang watch: could not write %s: %s", path, exc)
            return None
        return path


class _WatchedTimer:
    """A step's timer whose every phase is also a watched phase; everything else is the wrapped timer's."""

    def __init__(self, watch: HangWatch, inner: Any) -> None:
        self._watch, self._inner = watch, inner

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        with self._watch.phase(name), self._inner(name):
            yield

    def __getattr__(self, item: str) -> Any:
        return getattr(self._inner, item)


OFF = HangWatch(None)  # what a trainer outside `fit` uses: phases are timed, never watched
