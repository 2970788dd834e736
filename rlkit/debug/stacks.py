"""`rlkit debug stacks`: the Python stack of a run's driver and of each of its Ray workers, now, hung or not.

A run marks its processes: the driver puts `RLKIT_RUN_ID=<driver pid>` in the Ray job's environment, so every worker
process of the run carries it (on a private cluster and on one from `rlkit cluster up` alike), and each worker host
writes who it is (its group name, rank and roles) to `<tmp>/rlkit-runs/<run id>/<pid>.json`. The stacks are read with
py-spy (`py-spy dump`: no attach, no pause, works on a process stuck in C code), on this node.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from rlkit.errors import UserError

RUN_ID_ENV = "RLKIT_RUN_ID"
# frames that belong to the machinery around a phase (Ray, the worker host, the debugger), not to the phase
_MACHINERY = ("rlkit/controller/", "rlkit/debug/", "ray/", "debugpy/", "pydevd", "threading.py", "_raylet")
_FRAME_RE = re.compile(r"^\s+(?P<func>.+?) \((?P<loc>[^()]+:\d+)\)\s*$")


def run_env() -> dict[str, str]:
    """The variable that marks this driver's workers as its run's (merged into the job's runtime_env)."""
    return {RUN_ID_ENV: str(os.getpid())}


def registry_dir(run_id: str) -> Path:
    return Path(tempfile.gettempdir()) / "rlkit-runs" / run_id


def register_worker(name: str, rank: int, roles: Iterable[str]) -> None:
    """Called by a worker host at start: who this process is, for `rlkit debug stacks`."""
    run_id = os.environ.get(RUN_ID_ENV)
    if not run_id:
        return
    folder = registry_dir(run_id)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{os.getpid()}.json").write_text(json.dumps({"name": name, "rank": rank, "roles": list(roles)}))
    except OSError:  # a read-only /tmp costs the labels, never the run
        pass


def forget_run() -> None:
    """Called by the driver when its run ends: remove its workers' records."""
    shutil.rmtree(registry_dir(str(os.getpid())), ignore_errors=True)


@dataclass
class Proc:
    pid: int
    label: str  # "driver" or "<roles> rank <N> (<group>:<rank>)"
    rank: int | None = None
    frames: list[str] = field(default_factory=list)  # "func (file:line)", outermost first
    paused: bool = False  # waiting for a debugger
    error: str = ""

    @property
    def phase(self) -> str:
        """The innermost frame of rlkit's own code outside the machinery: where the process is in its work."""
        for frame in reversed(self.frames):
            loc = frame.rsplit("(", 1)[-1]
            if "rlkit/" in loc and not any(tag in loc for tag in _MACHINERY):
                return frame
        return self.frames[-1] if self.frames else "-"


def find_runs() -> dict[str, list[int]]:
    """Run id (the driver's pid) -> the pids of its live worker processes on this node."""
    import psutil

    runs: dict[str, list[int]] = {}
    for proc in psutil.process_iter(["pid"]):
        try:
            run_id = proc.environ().get(RUN_ID_ENV)
        except (psutil.Error, OSError):
            continue
        if run_id and proc.pid != int(run_id) and psutil.pid_exists(int(run_id)):
            runs.setdefault(run_id, []).append(proc.pid)
    return runs


def pick_run(runs: dict[str, list[int]], run: str | None) -> str:
    """The run asked for (`--run` = the driver's pid), or the only one running on this node."""
    if run is not None:
        run = run.strip()
        if run not in runs:
            import psutil

            if run.isdigit() and psutil.pid_exists(int(run)):
                return run  # a driver still starting its workers
            known = ", ".join(runs) or "none"
            raise UserError(f"--run {run}: no rlkit run with that driver pid on this node (runs: {known})")
        return run
    if not runs:
        raise UserError("no rlkit run on this node (a run shows here once its Ray workers start); "
                        "pass --run DRIVER_PID for one that is still starting")
    if len(runs) > 1:
        raise UserError(f"{len(runs)} runs on this node; pick one with --run: {', '.join(sorted(runs))} "
                        "(the drivers' pids)")
    return next(iter(runs))


def py_spy() -> str:
    exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(exe).exists():
        raise UserError("py-spy is not installed: pip install py-spy (rlkit depends on it)")
    return exe


def dump(pid: int, label: str, rank: int | None = None, timeout: float = 10.0) -> Proc:
    """The main thread's stack of `pid`, read with `py-spy dump` (no attach, no pause)."""
    proc = Proc(pid, label, rank)
    try:
        out = subprocess.run([py_spy(), "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.error = f"py-spy took more than {timeout:.0f}s"
        return proc
    if out.returncode != 0:
        proc.error = (out.stderr.strip().splitlines() or [f"py-spy exit {out.returncode}"])[-1]
        return proc
    proc.frames, proc.paused = main_thread(out.stdout)
    return proc


def main_thread(text: str) -> tuple[list[str], bool]:
    """From `py-spy dump` output: the main thread's frames (outermost first) and whether it waits for a debugger."""
    blocks = text.split("\nThread ")[1:]
    main = next((b for b in blocks if '"MainThread"' in b.splitlines()[0]), blocks[0] if blocks else "")
    frames = [f"{m['func']} ({m['loc']})" for m in map(_FRAME_RE.match, main.splitlines()[1:]) if m]
    return frames[::-1], "_wait_for_attach" in main or "wait_for_client" in main


def collect(run_id: str) -> list[Proc]:
    """The driver first, then the workers by rank."""
    runs = find_runs()
    procs = [dump(int(run_id), "driver")]
    records = registry_dir(run_id)
    for pid in sorted(runs.get(run_id, [])):
        try:
            who = json.loads((records / f"{pid}.json").read_text())
        except (OSError, ValueError):
            continue  # a Ray process of the run that hosts no worker (an idle pool process)
        roles = "+".join(r for r in who.get("roles", []) if r) or "worker"
        procs.append(dump(pid, f"{roles} rank {who['rank']} ({who['name']})", int(who["rank"])))
    procs[1:] = sorted(procs[1:], key=lambda p: (p.label.split(" rank ")[0], p.rank or 0))
    return procs


def grouped(procs: list[Proc]) -> list[list[Proc]]:
    """Processes with identical stacks together (the driver always alone, first)."""
    groups: dict[tuple, list[Proc]] = {}
    for p in procs:
        key = ("driver",) if p.label == "driver" else (p.error, p.paused, *p.frames)
        groups.setdefault(key, []).append(p)
    return list(groups.values())


def render(run_id: str, procs: list[Proc]) -> str:
    """Plain text: one block per distinct stack, innermost frame last (as Python's tracebacks)."""
    groups = grouped(procs)
    lines = [f"run {run_id}: driver + {len(procs) - 1} worker(s), {len(groups)} distinct stack(s) "
             "(main threads, innermost frame last)"]
    for group in groups:
        first = group[0]
        who = ", ".join(p.label if p.label == "driver" else f"{p.label} pid {p.pid}" for p in group)
        if first.label == "driver":
            who = f"driver pid {first.pid}"
        state = " [paused in the debugger]" if first.paused else ""
        lines += ["", f"== {who}{state}", f"   phase: {first.phase}"]
        lines += [f"   ! {first.error}"] if first.error else [f"     {frame}" for frame in first.frames]
    return "\n".join(lines)
