"""Debugging distributed runs: targeted breakpoints, debug-mode runtime settings, and the
pieces behind `rlkit cluster` and `rlkit debug` (dashboard queries, a DAP client, a REPL).

What the trainer does (mode: None | "on" | "post-mortem"):
    settings = debug_settings(mode)    # dist_timeout_s(d), ray_init_kwargs(), notes
    prepare_driver_env(mode)           # before ray.init
    ctx = ray.init(address, runtime_env=merge_runtime_env(env, debug_runtime_env(mode, break_at)),
                   **settings.ray_init_kwargs())
    restore_driver_breakpoint()        # after ray.init: breakpoint() in the driver opens pdb
    print(debug_banner(mode, ctx.dashboard_url, os.getcwd()))
    set_step(step); maybe_break("actor.update_policy")   # in workers, each step / phase
Users write `rlkit.debug.breakpoint(rank=0, step=None)`.
"""

from rlkit.debug.breakpoints import breakpoint, current_rank, current_step, maybe_break, set_step
from rlkit.debug.runtime import (
    DebugSettings,
    debug_banner,
    debug_runtime_env,
    debug_settings,
    merge_runtime_env,
    prepare_driver_env,
    restore_driver_breakpoint,
)

__all__ = [
    "DebugSettings",
    "breakpoint",
    "current_rank",
    "current_step",
    "debug_banner",
    "debug_runtime_env",
    "debug_settings",
    "maybe_break",
    "merge_runtime_env",
    "prepare_driver_env",
    "restore_driver_breakpoint",
    "set_step",
]
