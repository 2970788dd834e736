"""Run untrusted Python (model-written code) in a subprocess sandbox.

Each run gets a fresh `python -I` interpreter in a new session, started through
`_launcher.py`, with:

* a wall-time limit (the whole process group is SIGKILLed) and RLIMIT_CPU;
* RLIMIT_AS (memory), RLIMIT_FSIZE (largest file), RLIMIT_NOFILE, no core dumps;
* an output cap: at most `output_bytes` of stdout+stderr are read, then it is killed;
* a private scratch dir as cwd, HOME and TMPDIR, deleted afterwards; the
  environment is replaced, not inherited;
* where the OS allows (root, or unprivileged user namespaces): no network (new
  network namespace with only a down loopback), a read-only view of every other
  mount with the scratch dir as a size-capped tmpfs, a pid namespace (nothing
  the program forks outlives it) and, as root, an unprivileged uid of its own
  with RLIMIT_NPROC (fork bombs stop at `nproc` tasks).

`run_program` runs a program to its end; `SandboxProcess` + `pump` keep one running
and talk to it over its stdin/stdout (the code judge, rlkit/sandbox/code_judge.py).
`sandbox_capabilities()` runs a probe once and reports what is *measured* to be
enforced here. This is a guard against accidents and runaway programs, not a
security boundary against a determined attacker (no seccomp, shared kernel).
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import os
import selectors
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

LAUNCHER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_launcher.py")
STATUSES = ("ok", "runtime_error", "timeout", "memory", "syntax_error", "output_limit")
_uid_counter = itertools.count()


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one run. `cpu_s=None` means the wall limit rounded up."""

    wall_s: float = 5.0
    cpu_s: int | None = None
    memory_mb: int = 1024
    output_bytes: int = 1 << 20
    file_mb: int = 16
    scratch_mb: int = 64
    nproc: int = 64
    nofile: int = 256
    isolate: bool = True  # namespaces / read-only view / uid drop where possible
    python: str = sys.executable


@dataclass
class SandboxResult:
    status: str  # one of STATUSES
    returncode: int | None
    stdout: str
    stderr: str
    wall_s: float
    cpu_s: float | None = None
    maxrss_mb: float | None = None
    enforced: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass(frozen=True)
class SandboxJob:
    code: str
    stdin: str | None = None
    limits: SandboxLimits = SandboxLimits()


def _sandbox_uid() -> int | None:
    """A uid unused by real accounts, different per concurrent run so RLIMIT_NPROC counts only this run."""
    if os.geteuid() != 0:
        return None
    return 1_000_000 + (os.getpid() * 4099 + next(_uid_counter)) % 1_000_000


@functools.lru_cache(maxsize=8)
def _interpreter_paths(python: str) -> tuple[str, ...]:
    """Every path the interpreter needs: each hop of its symlink chain, prefixes and library dirs."""
    paths, p = [], os.path.abspath(python)
    for _ in range(40):
        paths.append(p)
        if not os.path.islink(p):
            break
        p = os.path.normpath(os.path.join(os.path.dirname(p), os.readlink(p)))
    paths += [sys.prefix, sys.base_prefix, *sysconfig.get_paths().values()]
    return tuple(x for x in dict.fromkeys(paths) if x and os.path.exists(x))


def _env(work: str, python: str) -> dict[str, str]:
    return {
        "PATH": f"{os.path.dirname(python)}:/usr/local/bin:/usr/bin:/bin",
        "HOME": work,
        "TMPDIR": work,
        "LANG": "C.UTF-8",
        "PYTHONIOENCODING": "utf-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
    }


def _classify(killed: str | None, report: dict | None, stderr: str, cpu_limit: int) -> tuple[str, int | None]:
    """Map how the run ended onto one of STATUSES (plus a shell-style return code)."""
    if killed:
        return killed, None
    if report is None:
        return "runtime_error", None
    sig, code = report.get("signal"), report.get("exit")
    rc = -sig if sig else code
    last = stderr.strip().splitlines()[-1] if stderr.strip() else ""
    if sig in (signal.SIGXCPU, signal.SIGKILL) and (report.get("cpu_s") or 0) >= cpu_limit - 0.05:
        return "timeout", rc
    if "MemoryError" in last or sig == signal.SIGKILL:
        return "memory", rc
    if code == 0:
        return "ok", rc
    if last.startswith(("SyntaxError", "IndentationError", "TabError")):
        return "syntax_error", rc
    return "runtime_error", rc


def _job_config(limits: SandboxLimits, cpu_limit: int, args: list[str], job: str, work: str) -> dict:
    return {
        "python": limits.python,
        "args": args,
        "env": _env(work, limits.python),
        "job": job,
        "work": work,
        "isolate": limits.isolate,
        "uid": _sandbox_uid() if limits.isolate else None,
        "expose": [*_interpreter_paths(limits.python), job],
        "scratch_bytes": limits.scratch_mb << 20,
        "limits": {
            "cpu_s": cpu_limit,
            "as_bytes": limits.memory_mb << 20,
            "fsize_bytes": limits.file_mb << 20,
            "nproc": limits.nproc,
            "nofile": limits.nofile,
        },
    }


class SandboxProcess:
    """One sandboxed interpreter while it runs: its pipes, its limits, its clean-up.

    `run_program` drives one to the end; the code judge (rlkit.sandbox.code_judge) keeps two alive and talks
    to them line by line (`interactive=True`: stdin is a pipe, stdout is a channel read with
    `take_line`, and only stderr counts towards `output_bytes`). `pump` services many at once.
    """

    def __init__(self, limits: SandboxLimits, *, code: str | None = None, argv: Sequence[str] = (),
                 stdin: str | None = None, interactive: bool = False) -> None:
        self.limits, self.interactive = limits, interactive
        self.cpu_limit = limits.cpu_s or max(1, math.ceil(limits.wall_s))
        self.job = tempfile.mkdtemp(prefix="rlkit-sbx-")
        self.result: SandboxResult | None = None
        self.killed: str | None = None
        self.out, self.err, self.status = bytearray(), bytearray(), bytearray()
        self._pending = bytearray()  # bytes still to write to an interactive stdin
        self._grace_until: float | None = None
        self._scanned = 0  # how much of `out` is known to hold no newline
        try:
            self._spawn(code, list(argv), stdin)
        except BaseException:
            shutil.rmtree(self.job, ignore_errors=True)
            raise

    def _spawn(self, code: str | None, argv: list[str], stdin: str | None) -> None:
        work = os.path.join(self.job, "work")
        os.mkdir(work, 0o700)
        args = ["-I", *argv]
        if code is not None:
            prog = os.path.join(self.job, "prog.py")
            with open(prog, "w", encoding="utf-8") as fh:
                fh.write(code)
            os.chmod(prog, 0o644)
            args = ["-I", prog, *argv]
        cfg = _job_config(self.limits, self.cpu_limit, args, self.job, work)
        status_r, status_w = os.pipe()
        cfg["status_fd"] = status_w
        stdin_arg: Any = subprocess.PIPE
        if not self.interactive:
            stdin_path = os.path.join(self.job, "stdin")
            with open(stdin_path, "w", encoding="utf-8") as fh:
                fh.write(stdin or "")
            stdin_arg = open(stdin_path, "rb")
        self.start = time.monotonic()
        self.hard_deadline = self.start + self.limits.wall_s
        try:
            self.proc = subprocess.Popen(
                [self.limits.python, "-I", "-S", LAUNCHER, json.dumps(cfg)],
                stdin=stdin_arg,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(status_w,),
                start_new_session=True,
                env={},
            )
        except BaseException:
            os.close(status_r)
            raise
        finally:
            os.close(status_w)
            if not self.interactive:
                stdin_arg.close()
        self._fds = {self.proc.stdout.fileno(): self.out, self.proc.stderr.fileno(): self.err, status_r: self.status}
        self._status_fd = status_r
        for fd in self._fds:
            os.set_blocking(fd, False)
        self._stdin_fd = self.proc.stdin.fileno() if self.interactive else None
        if self._stdin_fd is not None:
            os.set_blocking(self._stdin_fd, False)
        if self.interactive and stdin:
            self.send(stdin)

    # ---------------------------------------------------------------- talking to it (interactive mode)

    def send(self, text: str) -> None:
        """Queue `text` for the program's stdin (written by `pump`; dropped once the program is gone)."""
        if self._stdin_fd is not None:
            self._pending += text.encode("utf-8")

    def take_line(self, max_bytes: int) -> bytes | None:
        """The next complete stdout line (without the newline), or None. A line longer than `max_bytes`
        kills the program with `output_limit`."""
        nl = self.out.find(b"\n", self._scanned, max_bytes + 1)
        if nl < 0:
            self._scanned = len(self.out)  # the next search starts where this one stopped
            if len(self.out) > max_bytes:
                self.kill("output_limit")
            return None
        line = bytes(self.out[:nl])
        del self.out[: nl + 1]
        self._scanned = 0
        return line

    # ---------------------------------------------------------------- state

    @property
    def running(self) -> bool:
        """Still worth waiting for: not killed, and its streams not closed (after a short drain)."""
        if self.killed or not self._fds:
            return False
        if self._grace_until is not None and time.monotonic() >= self._grace_until:
            return False
        return True

    @property
    def drained(self) -> bool:
        """Nothing read from stdout and not yet taken, nothing queued for stdin."""
        return not self.out and not self._pending

    @property
    def exited(self) -> bool:
        """The program has ended (its reaper reported) or was killed."""
        return bool(self.killed) or self._status_fd not in self._fds

    def kill(self, reason: str) -> None:
        if self.killed is None and self.result is None:
            self.killed = reason
            _killpg(self.proc.pid)

    def _watch(self, sel: selectors.BaseSelector) -> None:
        for fd in self._fds:
            sel.register(fd, selectors.EVENT_READ, (self, fd))
        if self._stdin_fd is not None and self._pending:
            sel.register(self._stdin_fd, selectors.EVENT_WRITE, (self, self._stdin_fd))

    def _on_event(self, fd: int) -> None:
        if fd == self._stdin_fd:
            try:
                n = os.write(fd, self._pending[:65536])
                del self._pending[:n]
            except BlockingIOError:
                pass
            except OSError:  # the program closed its stdin or ended
                self._pending.clear()
                self._close_stdin()
            return
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            return
        if not chunk:
            del self._fds[fd]
            if fd == self._status_fd:  # the reaper reported; let the output pipes drain briefly
                self._grace_until = time.monotonic() + 0.2
                self._close_stdin()
            return
        self._fds[fd] += chunk
        counted = len(self.err) + (0 if self.interactive else len(self.out))
        if counted > self.limits.output_bytes:
            self.kill("output_limit")

    def _close_stdin(self) -> None:
        if self._stdin_fd is not None:
            self._stdin_fd = None
            try:
                self.proc.stdin.close()
            except OSError:
                pass

    # ---------------------------------------------------------------- the end

    def finish(self) -> SandboxResult:
        """Kill what is left, reap, classify, delete the job dir; idempotent."""
        if self.result is not None:
            return self.result
        _killpg(self.proc.pid)  # stragglers; the group still exists while the launcher is unreaped
        self.proc.wait()
        for fd in list(self._fds):
            if fd != self._status_fd:
                continue
            try:
                while chunk := os.read(fd, 65536):
                    self.status += chunk
            except OSError:
                pass
        os.close(self._status_fd)
        self._fds = {}
        self._close_stdin()
        self.proc.stdout.close()
        self.proc.stderr.close()
        shutil.rmtree(self.job, ignore_errors=True)
        wall = time.monotonic() - self.start
        stderr = bytes(self.err[: self.limits.output_bytes]).decode("utf-8", "replace")
        report = None
        if self.status:
            try:
                report = json.loads(self.status.decode().splitlines()[0])
            except (ValueError, IndexError):
                report = None
        state, rc = _classify(self.killed, report, stderr, self.cpu_limit)
        self.result = SandboxResult(
            status=state,
            returncode=rc,
            stdout=bytes(self.out[: self.limits.output_bytes]).decode("utf-8", "replace"),
            stderr=stderr,
            wall_s=wall,
            cpu_s=report.get("cpu_s") if report else None,
            maxrss_mb=report["maxrss_kb"] / 1024 if report and report.get("maxrss_kb") else None,
            enforced=report.get("enforced", {}) if report else {},
        )
        return self.result


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def pump(procs: Iterable[SandboxProcess], until: float) -> None:
    """Wait until one of `procs` has something to read or write (or `until`), and service it.

    Enforces each process's wall limit (`timeout`) and output cap (`output_limit`) as it goes.
    """
    live = [p for p in procs if p.running]
    now = time.monotonic()
    for p in live:
        if now >= p.hard_deadline:
            p.kill("timeout")
    live = [p for p in live if p.running]
    if not live:
        return
    wake = min([until, *(p.hard_deadline for p in live), *(p._grace_until for p in live if p._grace_until)])
    with selectors.DefaultSelector() as sel:
        for p in live:
            p._watch(sel)
        for key, _ in sel.select(timeout=max(0.0, wake - now)):
            proc, fd = key.data
            if proc.running:
                proc._on_event(fd)


def run_program(code: str, stdin: str | None = None, limits: SandboxLimits | None = None) -> SandboxResult:
    """Run `code` as a Python program in the sandbox; never raises for anything the program does."""
    proc = SandboxProcess(limits or SandboxLimits(), code=code, stdin=stdin)
    try:
        while proc.running:
            pump([proc], proc.hard_deadline)
        return proc.finish()
    finally:
        proc.finish()


def run_many(jobs: Sequence[SandboxJob], max_workers: int | None = None) -> list[SandboxResult]:
    """Run jobs concurrently (threads waiting on subprocesses); results in job order."""
    if not jobs:
        return []
    workers = max_workers or min(len(jobs), os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rlkit-sandbox") as pool:
        return list(pool.map(lambda j: run_program(j.code, j.stdin, j.limits), jobs))
