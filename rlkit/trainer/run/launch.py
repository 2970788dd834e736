"""Start (or join) Ray with the right runtime environment and run a trainer: what `rlkit train` does."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rich.console import Console

from rlkit.trainer.run.run_summary import print_table, summary_table


@dataclass
class LaunchOptions:
    address: str | None = None
    debug: str | None = None  # None | "on" | "post-mortem"
    num_cpus: int | None = None


def anomaly_settings(cfg: Any, opts: LaunchOptions) -> dict[str, str]:
    """The environment of `--debug nan` / trainer.debug.detect_anomaly (rlkit.debug.anomaly), set in the driver
    too: pause for the debugger when the run is debuggable and someone is at the terminal, else save and stop."""
    import sys

    from rlkit.debug.anomaly import anomaly_env, anomaly_mode
    from rlkit.debug.runtime import get_mode
    from rlkit.trainer.run.preflight import log_dir_of

    mode = get_mode(opts.debug)
    asked = getattr(getattr(cfg.trainer, "debug", None), "detect_anomaly", False)  # SFT/DPO configs: no key
    if not (asked or mode.detect_anomaly):
        return {}
    env = anomaly_env(mode.enabled and sys.stdin.isatty(), log_dir_of(cfg),
                      os.path.expanduser(cfg.trainer.default_local_dir))
    os.environ.update(env)
    anomaly_mode.cache_clear()  # read again in this process
    return env


def init_ray(cfg: Any, opts: LaunchOptions, console: Console) -> Any:
    import ray

    from rlkit.controller.cluster import (
        PRIVATE,
        choose_cluster,
        huge_pages_env,
        record_driver_cluster,
        with_worker_env,
    )
    from rlkit.controller.cluster_auth import join_auth
    from rlkit.debug import (
        debug_banner,
        debug_runtime_env,
        debug_settings,
        merge_runtime_env,
        prepare_driver_env,
        restore_driver_breakpoint,
    )
    from rlkit.debug.listeners import use_loopback_node
    from rlkit.debug.stacks import run_env
    from rlkit.trainer.run.ray_init_kwargs import merge_ray_init
    from rlkit.utils.quiet import verbose, worker_env

    settings = debug_settings(opts.debug)
    prepare_driver_env(opts.debug)
    env_vars = {
        "TOKENIZERS_PARALLELISM": "false",
        # third-party log lines, C++ warnings and loading bars drown the progress view (rlkit.utils.quiet);
        # RLKIT_VERBOSE=1 or your own values keep them
        **worker_env(),
        "RLKIT_DIST_TIMEOUT_S": str(int(settings.dist_timeout_s(1800))),  # read with int() in the workers
        **anomaly_settings(cfg, opts),
        **run_env(),  # marks the run's worker processes (`rlkit debug stacks`)
        **huge_pages_env(engine_in_workers=hasattr(cfg, "actor_rollout_ref")),  # SFT, DPO: no engine beside them
    }
    break_at = cfg.trainer.debug.break_at if hasattr(cfg.trainer, "debug") else []  # SFT: no worker phases to break at
    runtime_env = merge_runtime_env({"env_vars": env_vars}, debug_runtime_env(opts.debug, break_at))
    kwargs: dict[str, Any] = {"runtime_env": runtime_env, "log_to_driver": True}
    if not verbose():
        kwargs["logging_level"] = logging.WARNING  # "Started a local Ray instance." and the like (RLKIT_VERBOSE=1)
    target = choose_cluster(opts.address)  # --address, $RAY_ADDRESS, `rlkit cluster up`'s, else a private one
    if target.loopback:
        use_loopback_node()  # one machine: every Ray port, debugpy's included, on 127.0.0.1
    if target.private:
        os.environ.update(with_worker_env(dict(os.environ)))  # the raylet this ray.init starts reads it
        kwargs.update({"address": PRIVATE, "num_cpus": opts.num_cpus or os.cpu_count(), "include_dashboard": False,
                       **settings.ray_init_kwargs()})  # fmt: skip
    else:
        kwargs["address"] = target.address
    ray_init = getattr(getattr(cfg, "ray_kwargs", None), "ray_init", None)  # verl's ray_kwargs.ray_init, on top
    kwargs, ignored = merge_ray_init(kwargs, ray_init, joining=not target.private, cli_num_cpus=opts.num_cpus)
    if ignored:
        console.print(ignored, markup=False, highlight=False, soft_wrap=True)
    if target.joined is not None:
        join_auth(target)  # its token when it is on the network (checked: one line if refused), else auth off
        console.print(f"joining the cluster from `rlkit cluster up` at {target.address} (dashboard "
                      f"{target.joined.dashboard_url}); `--address local` runs on a private one",
                      markup=False, highlight=False, soft_wrap=True)  # fmt: skip
    ctx = ray.init(**kwargs)
    restore_driver_breakpoint()
    if opts.debug:
        url = getattr(ctx, "dashboard_url", None)
        info = getattr(ctx, "address_info", {}) or {}
        if target.private:
            record_driver_cluster(url, info.get("address", ""))
        console.print(debug_banner(opts.debug, url, os.getcwd(), node_ip=info.get("node_ip_address", "")))
    return ctx


def run_kind(kind: Any, cfg: Any, opts: LaunchOptions, console: Console | None = None) -> Any:
    """Run a trainer kind's job (`kind`: its launcher module, rlkit/trainer/run/trainers.py): its resource plan,
    its pre-flight checks (before Ray starts), then `run_fit` with the trainer its `start` builds; returns the
    FitSummary. Ctrl-C stops the workers and raises TrainingInterrupted (step reached, last complete checkpoint)
    instead of a traceback."""
    from rlkit.utils.status_line import waiting

    console = console or Console()
    print_table(console, kind.plan(cfg))
    with waiting(console, "pre-flight checks (data, model, output folders)..."):
        notes = kind.preflight(cfg, allow_download=True)
    console.print("pre-flight ok: " + "; ".join(notes), soft_wrap=True, markup=False)
    anomaly_settings(cfg, opts)  # the driver's own checks (rewards, advantages); init_ray passes it to the workers
    return run_fit(cfg, opts, console, lambda: kind.start(cfg, opts),
                   lambda trainer, summary: kind.describe(trainer, summary, cfg))


def run_fit(cfg: Any, opts: LaunchOptions, console: Console, start: Callable[[], Any],
            describe: Callable[[Any, Any], None]) -> Any:
    """Any trainer's run (RL, SFT, ...): Ray up, `start()` builds the trainer, its `fit()` under the trackers, the
    summary (`describe` adds the trainer's own lines) printed; Ctrl-C / SIGTERM stop the workers and raise
    TrainingInterrupted."""
    import ray

    from rlkit.debug.runtime import get_mode
    from rlkit.trainer.run.interrupt import InterruptWatch, TrainingInterrupted
    from rlkit.trainer.run.preflight import log_dir_of
    from rlkit.trainer.run.ray_init_kwargs import write_timeline
    from rlkit.utils.checkpoint_io import find_latest_checkpoint
    from rlkit.utils.status_line import waiting
    from rlkit.utils.tracking import Tracking

    started = time.perf_counter()
    owns_ray = not ray.is_initialized()
    log_dir = log_dir_of(cfg)
    trainer = None
    with InterruptWatch() as watch:
        try:
            with waiting(console, "starting Ray and the workers (model load, FSDP, rollout engine)..."):
                if owns_ray:
                    init_ray(cfg, opts, console)
                    watch.rearm()  # ray.init put a C++ SIGTERM handler (stack dumps, no shutdown) over ours
                trainer = start()
                trainer.watch_hangs = not get_mode(opts.debug).enabled  # a process paused for a debugger is no hang
            with Tracking(cfg.trainer.logger, cfg.trainer.project_name, cfg.trainer.experiment_name, log_dir,
                          trainer.total_steps, cfg) as tracker:
                trainer.tracker = tracker
                summary = trainer.fit()
            write_timeline(getattr(getattr(cfg, "ray_kwargs", None), "timeline_json_file", None))
            summary.log_dir = log_dir
            describe(trainer, summary)
            summary.wall_s = time.perf_counter() - started  # type: ignore[attr-defined]
            print_table(console, summary_table(summary))
            return summary
        except BaseException as exc:
            # Ctrl-C, or a worker killed by the same Ctrl-C a moment before the driver got it
            if not (isinstance(exc, KeyboardInterrupt) or watch.hit):
                raise
            step = None if trainer is None else trainer.global_step
            total = None if trainer is None else trainer.total_steps
            interrupted = TrainingInterrupted(step, total, None, watch.signum)
        finally:
            watch.stopping()  # a second Ctrl-C must not cut the shutdown short and leave Ray's processes behind
            _stop(trainer, owns_ray)
    interrupted.checkpoint = find_latest_checkpoint(cfg.trainer.default_local_dir)
    raise interrupted


def _stop(trainer: Any, owns_ray: bool) -> None:
    """Stop the workers and our Ray, and wait for every process Ray started (its dashboard and runtime-env agents
    outlive `ray.shutdown()` by seconds otherwise); a second Ctrl-C while that runs does not leave a traceback."""
    import psutil
    import ray

    from rlkit.controller.processes import end_processes
    from rlkit.debug.stacks import forget_run

    forget_run()
    try:
        if trainer is not None:
            trainer.workers.shutdown()
    except KeyboardInterrupt:
        pass
    finally:
        if owns_ray:
            children = psutil.Process().children(recursive=True)  # a private Ray's processes all descend from us
            try:
                ray.shutdown()
            except KeyboardInterrupt:
                pass
            end_processes(children)
