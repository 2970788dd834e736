"""What a training run changes when it is (or is not) being debugged.

`debug_runtime_env(mode)` is merged into the Ray job's `runtime_env` so every worker
gets it; `debug_settings(mode)` tells the trainer which timeouts to relax.
Modes: None (off), "on", "post-mortem", "nan" ("on" + stop at the first NaN/Inf: rlkit.debug.anomaly).

Why each piece (verified with Ray 2.60 / debugpy 1.8.22):
- RAY_DEBUG=1 makes `breakpoint()` in a worker open debugpy on the node IP and wait
  for a client (the dashboard lists it); any value other than "1"/"legacy" makes it
  a silent no-op, which is what we want when debugging is off.
- RAY_DEBUG_POST_MORTEM=1 pauses a worker on an uncaught exception in a task.
- A paused rank stalls its peers in the next collective: NCCL/gloo timeouts must be
  long. The driver's `ray.get` has no timeout and Ray never restarts an actor or retries a
  task (rlkit's worker groups ask for neither, in any mode), so a "hung" actor is left alone.
- Ray sets PYTHONBREAKPOINT in every process it connects (the driver included), so
  a worker-side setup hook and a driver helper put the behaviour we want back.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

from rlkit.debug.breakpoints import BREAK_AT_ENV, parse_break_at
from rlkit.registry import Registry
from rlkit.utils.once import Once

DEBUG_ENV = "RLKIT_DEBUG"
DEBUG_TIMEOUT_S = 6 * 3600.0  # long enough to read a stack trace over lunch
# Captured at import, before ray.init() overwrites it in this (driver) process.
_DRIVER_BREAKPOINT = os.environ.get("PYTHONBREAKPOINT")


@dataclass(frozen=True)
class DebugMode:
    name: str
    enabled: bool
    post_mortem: bool
    detect_anomaly: bool = False


MODES: Registry[DebugMode] = Registry("debug mode")
MODES.add("off", DebugMode("off", enabled=False, post_mortem=False))
MODES.add("on", DebugMode("on", enabled=True, post_mortem=False))
MODES.add("post-mortem", DebugMode("post-mortem", enabled=True, post_mortem=True))
MODES.add("nan", DebugMode("nan", enabled=True, post_mortem=False, detect_anomaly=True))


def get_mode(mode: str | None) -> DebugMode:
    """None means off; anything unknown is a UserError naming the valid modes."""
    return MODES.get(mode or "off")


_DEBUG_ENV_VARS = {
    "RAY_DEBUG": "1",
    # debugpy warns about frozen modules (Python 3.11+) on every attach; it is noise here.
    "PYDEVD_DISABLE_FILE_VALIDATION": "1",
    # Evaluating a big tensor's repr can take a while: do not nag after 3 s.
    "PYDEVD_WARN_EVALUATION_TIMEOUT": "30",
    # A paused rank keeps NCCL collectives waiting: keep the watchdog from killing peers.
    "TORCH_NCCL_ENABLE_MONITORING": "0",
    "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": str(int(DEBUG_TIMEOUT_S)),
    # vLLM's multiprocess executor (TP > 1) times out execute_model after 300 s by default.
    "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": str(int(DEBUG_TIMEOUT_S)),
}

# Not "1" nor "legacy": Ray's breakpoint hook returns at once, so a stray breakpoint() can't hang a run.
_OFF_ENV_VARS = {"RAY_DEBUG": "0", "RAY_DEBUG_POST_MORTEM": "0"}
SILENCE_HOOK = "rlkit.debug.runtime.silence_worker_breakpoints"


def debug_runtime_env(mode: str | None, break_at: Sequence[str] | str = ()) -> dict:
    """The `runtime_env` fragment for a Ray job: {"env_vars": {...}} (+ a setup hook when off).

    Merge it into the job's runtime_env (env_vars dicts merged, ours last). `break_at` lists
    phases for `maybe_break` (see rlkit.debug.breakpoints); it only takes effect in debug mode.
    """
    spec = get_mode(mode)
    if not spec.enabled:
        return {"env_vars": {**_OFF_ENV_VARS, DEBUG_ENV: "off"}, "worker_process_setup_hook": SILENCE_HOOK}
    env = {**_DEBUG_ENV_VARS, "RAY_DEBUG_POST_MORTEM": "1" if spec.post_mortem else "0", DEBUG_ENV: spec.name}
    rules = break_at if isinstance(break_at, str) else ",".join(break_at)
    if rules:
        parse_break_at(rules)  # fail in the driver, not in a worker
        env[BREAK_AT_ENV] = rules
    return {"env_vars": env}


@dataclass(frozen=True)
class DebugSettings:
    """What the trainer relaxes in debug mode; each method takes the trainer's normal value."""

    mode: DebugMode
    long_timeout_s: float = DEBUG_TIMEOUT_S
    notes: list[str] = field(default_factory=list)

    @property
    def enabled(self) -> bool:
        return self.mode.enabled

    def dist_timeout_s(self, default: float) -> float:
        """Seconds for `init_process_group(timeout=...)` (NCCL and gloo)."""
        return max(default, self.long_timeout_s) if self.enabled else default

    def ray_init_kwargs(self) -> dict:
        """Extra `ray.init` kwargs when the run starts its own local cluster: the debugger needs the dashboard."""
        return {"include_dashboard": True, "dashboard_host": "127.0.0.1"} if self.enabled else {}


def debug_settings(mode: str | None) -> DebugSettings:
    spec = get_mode(mode)
    notes = []
    if spec.enabled:
        notes.append("distributed timeouts relaxed (the driver's ray.get waits without a timeout; no actor restarts)")
    if spec.post_mortem:
        notes.append("workers also pause on uncaught exceptions (post-mortem)")
    if spec.detect_anomaly:
        notes.append("the first NaN/Inf in a loss, gradient, log-prob, advantage or reward pauses where it appears "
                     "(at a terminal; in a log file its micro-batch is saved and the run stops)")
    return DebugSettings(mode=spec, notes=notes)


def prepare_driver_env(mode: str | None) -> None:
    """Call before `ray.init()` in debug mode: token auth (Ray 2.60's default for new local clusters) must be
    off, or the VS Code extension, which sends no token, cannot list workers. An explicit setting is kept."""
    if get_mode(mode).enabled:
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")


def merge_runtime_env(base: dict | None, extra: dict) -> dict:
    """`base` with `extra` on top; env_vars are merged key by key (extra wins)."""
    merged = {**(base or {}), **extra}
    if (base or {}).get("env_vars") or extra.get("env_vars"):
        merged["env_vars"] = {**(base or {}).get("env_vars", {}), **extra.get("env_vars", {})}
    return merged


def debug_banner(mode: str | None, dashboard_url: str | None, local_folder: str, node_ip: str = "") -> str:
    """Lines the trainer prints at start so the user knows how to attach (and who else could)."""
    from rlkit.debug.listeners import is_loopback

    spec = get_mode(mode)
    if not spec.enabled:
        return ""
    url = dashboard_url or "(no dashboard: start one with `rlkit cluster up`)"
    if not node_ip or is_loopback(node_ip):
        where = "  - a paused worker's debugpy listens on 127.0.0.1 (single node: loopback only)"
    else:  # Ray's debugpy listens on the node IP so a debugger on another machine can attach
        where = (f"  - warning: a paused worker's debugpy listens on {node_ip} (multi-node) without authentication:"
                 " anyone who can reach that address can run code in the worker; use a trusted network")
    lines = [
        f"Debug mode '{spec.name}': a breakpoint() in any Ray worker pauses it and waits for a debugger.",
        *(f"  - {n}" for n in debug_settings(mode).notes),
        where,
        f"  VS Code: Ray Distributed Debugger -> Add Cluster -> {url}; local folder: {local_folder}",
        "  Terminal: rlkit debug list   then   rlkit debug attach",
    ]
    return "\n".join(lines)


# -- when debugging is off -------------------------------------------------------------------
_warned = Once()


def _disabled_breakpoint(*_args: object, **_kwargs: object) -> None:
    """A worker's breakpoint() while debugging is off: warn once per process and keep going."""
    if _warned.first():
        # Same text in every worker, so Ray's log dedup folds them into one line on the driver.
        print("[rlkit.debug] breakpoint() ignored in a Ray worker: debugging is off (pass --debug to pause there).",
              file=sys.stderr, flush=True)


def silence_worker_breakpoints() -> None:
    """Ray `worker_process_setup_hook`: runs after Ray set PYTHONBREAKPOINT, so it can point it at us."""
    os.environ["PYTHONBREAKPOINT"] = f"{__name__}._disabled_breakpoint"


def restore_driver_breakpoint() -> None:
    """Call in the driver after `ray.init()`: Ray routes the driver's breakpoint() to debugpy; we want pdb."""
    if _DRIVER_BREAKPOINT is None or _DRIVER_BREAKPOINT.startswith("ray."):
        os.environ.pop("PYTHONBREAKPOINT", None)  # unset -> pdb.set_trace
    else:
        os.environ["PYTHONBREAKPOINT"] = _DRIVER_BREAKPOINT
