"""Run untrusted Python (model-written code) in a subprocess sandbox.

Each run gets a fresh `python -I` interpreter in a new session, started through
`_sandbox_launcher.py`, with:

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
import resource
import selectors
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

LAUNCHER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_sandbox_launcher.py")
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


def run_program(code: str, stdin: str | None = None, limits: SandboxLimits | None = None) -> SandboxResult:
    """Run `code` as a Python program in the sandbox; never raises for anything the program does."""
    limits = limits or SandboxLimits()
    cpu_limit = limits.cpu_s or max(1, math.ceil(limits.wall_s))
    job = tempfile.mkdtemp(prefix="rlkit-sbx-")
    try:
        work = os.path.join(job, "work")
        os.mkdir(work, 0o700)
        prog = os.path.join(job, "prog.py")
        with open(prog, "w", encoding="utf-8") as fh:
            fh.write(code)
        os.chmod(prog, 0o644)
        stdin_path = os.path.join(job, "stdin")
        with open(stdin_path, "w", encoding="utf-8") as fh:
            fh.write(stdin or "")
        cfg = {
            "python": limits.python,
            "args": ["-I", prog],
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
        return _launch(cfg, stdin_path, limits, cpu_limit)
    finally:
        shutil.rmtree(job, ignore_errors=True)


def _launch(cfg: dict, stdin_path: str, limits: SandboxLimits, cpu_limit: int) -> SandboxResult:
    status_r, status_w = os.pipe()
    cfg["status_fd"] = status_w
    start = time.monotonic()
    with open(stdin_path, "rb") as stdin_fh:
        try:
            proc = subprocess.Popen(
                [limits.python, "-I", "-S", LAUNCHER, json.dumps(cfg)],
                stdin=stdin_fh,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(status_w,),
                start_new_session=True,
                env={},
            )
        finally:
            os.close(status_w)
    out, err, status, killed = _collect(proc, status_r, limits, start)
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # stragglers; the group still exists while L is unreaped
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
    wall = time.monotonic() - start
    stderr = err.decode("utf-8", "replace")
    report = None
    if status:
        try:
            report = json.loads(status.decode().splitlines()[0])
        except (ValueError, IndexError):
            report = None
    state, rc = _classify(killed, report, stderr, cpu_limit)
    return SandboxResult(
        status=state,
        returncode=rc,
        stdout=out.decode("utf-8", "replace"),
        stderr=stderr,
        wall_s=wall,
        cpu_s=report.get("cpu_s") if report else None,
        maxrss_mb=report["maxrss_kb"] / 1024 if report and report.get("maxrss_kb") else None,
        enforced=report.get("enforced", {}) if report else {},
    )


def _collect(proc, status_r: int, limits: SandboxLimits, start: float) -> tuple[bytes, bytes, bytes, str | None]:
    """Read stdout/stderr/status until the reaper reports (or a limit is hit); returns what was read."""
    bufs = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray(), status_r: bytearray()}
    sel = selectors.DefaultSelector()
    for fd in bufs:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    killed, total, grace_until = None, 0, None
    hard = start + limits.wall_s
    try:
        while sel.get_map() and not killed:
            now = time.monotonic()
            if now >= hard:
                killed = "timeout"
                break
            if grace_until is not None and now >= grace_until:
                break  # the program is done but something it spawned still holds a pipe
            for key, _ in sel.select(timeout=min(hard, grace_until or hard) - now):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fd)
                    if key.fd == status_r:  # the reaper reported; let the output pipes drain briefly
                        grace_until = time.monotonic() + 0.2
                    continue
                bufs[key.fd] += chunk
                if key.fd != status_r:
                    total += len(chunk)
                    if total > limits.output_bytes:
                        killed = "output_limit"
                        break
    finally:
        sel.close()
        os.close(status_r)
    if killed:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    out, err = bytes(bufs[proc.stdout.fileno()]), bytes(bufs[proc.stderr.fileno()])
    proc.stdout.close()
    proc.stderr.close()
    return out[: limits.output_bytes], err[: limits.output_bytes], bytes(bufs[status_r]), killed


def run_many(jobs: Sequence[SandboxJob], max_workers: int | None = None) -> list[SandboxResult]:
    """Run jobs concurrently (threads waiting on subprocesses); results in job order."""
    if not jobs:
        return []
    workers = max_workers or min(len(jobs), os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rlkit-sandbox") as pool:
        return list(pool.map(lambda j: run_program(j.code, j.stdin, j.limits), jobs))


_PROBE = r"""
import json, os, resource, socket, sys
out = {"uid": os.getuid(), "pid": os.getpid(), "cwd": os.getcwd(), "home": os.environ.get("HOME")}
try:
    os.makedirs(os.path.join(os.path.dirname(os.getcwd()), "outside"))
    out["write_outside"] = True
except OSError:
    out["write_outside"] = False
try:
    out["net_ifaces"] = sorted(os.listdir("/sys/class/net"))
except OSError:
    out["net_ifaces"] = None
s = socket.socket()
s.settimeout(0.5)
try:
    s.connect(("127.0.0.1", int(sys.stdin.read() or 9)))
    out["loopback_connect"] = True
except OSError:
    out["loopback_connect"] = False
out["nproc"] = resource.getrlimit(resource.RLIMIT_NPROC)[0]
print(json.dumps(out))
"""


@functools.lru_cache(maxsize=1)
def sandbox_capabilities() -> dict:
    """Measure once what the sandbox enforces on this machine (runs a probe program)."""
    import socket

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    try:
        res = run_program(_PROBE, stdin=str(port), limits=replace(SandboxLimits(), wall_s=10.0))
    finally:
        server.close()
    caps = {
        "subprocess": True,
        "wall_timeout": True,
        "output_cap": True,
        "rlimit_cpu": True,
        "rlimit_as": True,
        "rlimit_fsize": True,
        "env_stripped": True,
        "scratch_cwd_home": False,
        "network_isolated": False,
        "readonly_fs": False,
        "scratch_tmpfs": False,
        "pid_namespace": False,
        "unprivileged_uid": False,
        "nproc_limit": False,
        "probe_status": res.status,
    }
    try:
        seen = json.loads(res.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        caps["probe_error"] = res.stderr[-500:]
        return caps
    enforced = res.enforced
    caps["scratch_cwd_home"] = seen["cwd"] == seen["home"]
    caps["network_isolated"] = not seen["loopback_connect"] and bool(enforced.get("netns"))
    caps["readonly_fs"] = not seen["write_outside"]
    caps["scratch_tmpfs"] = bool(enforced.get("scratch_tmpfs"))
    caps["pid_namespace"] = seen["pid"] <= 2
    # in a user namespace the program sees uid 0, but on the host it is our own non-root uid
    caps["unprivileged_uid"] = seen["uid"] != 0 or (bool(enforced.get("userns")) and os.geteuid() != 0)
    caps["nproc_limit"] = seen["uid"] != 0 and seen["nproc"] != resource.RLIM_INFINITY
    caps["user_namespace"] = bool(enforced.get("userns"))
    return caps
