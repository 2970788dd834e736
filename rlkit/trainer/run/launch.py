"""Start (or join) Ray with the right runtime environment and run a trainer: what `rlkit train` does."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table

from rlkit.config.checks import world_size
from rlkit.config.schema import RLConfig
from rlkit.trainer.run.run_summary import actor_memory, moe_params, print_table, summary_table


@dataclass
class LaunchOptions:
    address: str | None = None
    debug: str | None = None  # None | "on" | "post-mortem"
    num_cpus: int | None = None


def resource_plan(cfg: RLConfig) -> Table:
    """What will run where (printed by --dry-run and at start-up)."""
    from rlkit.reward.mix import describe as describe_reward
    from rlkit.trainer.run.workers_setup import plan_layout
    from rlkit.utils.cpu_precision import plan_row

    t = cfg.trainer
    name = {"rollout": f"rollout ({cfg.actor_rollout_ref.rollout.name})"}
    trainer, *separate = plan_layout(cfg).groups  # the layout build_workers spawns
    n = cfg.actor_rollout_ref.rollout.n
    table = Table(title="resource plan", show_header=False)
    table.add_row("workers", f"{t.nnodes} node(s) x {t.n_gpus_per_node} = {world_size(cfg)} (device: {t.device})")
    table.add_row("colocated roles per worker", ", ".join(name.get(r, r) for r in trainer.roles))
    for role, line in mesh_rows(cfg, trainer.roles, trainer.nnodes * trainer.per_node):
        table.add_row(f"{role} mesh", line)
    for group in separate:  # one-step-off: the engines in processes of their own
        table.add_row(f"separate {', '.join(name.get(r, r) for r in group.roles)} workers",
                      f"{group.nnodes} node(s) x {group.per_node} = {group.nnodes * group.per_node}, "
                      f"each a GPU (or {group.cpus_per_process:g} CPU without one)")
    actor = cfg.actor_rollout_ref.actor
    bsz = cfg.data.train_batch_size
    table.add_row("sequences per step", f"{bsz} prompts x n={n} = {bsz * n}")
    table.add_row("optimizer steps per step", str(bsz // actor.ppo_mini_batch_size * actor.ppo_epochs))
    table.add_row("advantage estimator", cfg.algorithm.adv_estimator)
    table.add_row("policy loss", f"{actor.policy_loss} ({actor.loss_agg_mode})")
    threads = max(1, int(t.cpus_per_worker))  # the workers' torch threads: their measurement is the one cached
    table.add_row("actor compute dtype", plan_row(actor.fsdp_config.param_dtype, t.device, threads))
    name = cfg.actor_rollout_ref.rollout.dtype
    table.add_row("rollout engine dtype", f"auto -> {engine_precision(cfg)}" if name == "auto" else name)
    table.add_row("reward", describe_reward(cfg))
    table.add_row("checkpoints", cfg.trainer.default_local_dir)
    return table


def mesh_rows(cfg: RLConfig, roles: list[str], workers: int) -> list[tuple[str, str]]:
    """Each trained or frozen FSDP role's device mesh (rlkit/workers/parallel_layout.py) and the weight memory per
    rank it implies: fp32 weights (+ gradients + AdamW's two moments when trained) / (shard x tp); activations
    and the engine not counted. The parameter count is read from the model's config.json when it is local."""
    from rlkit.workers.parallel_layout import ParallelLayout

    arr = cfg.actor_rollout_ref
    lora = bool(arr.model.lora_rank or arr.model.lora_adapter_path)
    sections = {"actor": (arr.actor.fsdp_config, arr.actor.ulysses_sequence_parallel_size, arr.model.path, not lora),
                "ref": (arr.ref.fsdp_config, arr.ref.ulysses_sequence_parallel_size, arr.model.path, False),
                "critic": (cfg.critic.fsdp_config, cfg.critic.ulysses_sequence_parallel_size, cfg.critic.model.path,
                           True)}
    rows = []
    for role in (r for r in roles if r in sections):
        fsdp, sp, path, trained = sections[role]
        try:
            layout = ParallelLayout.of(fsdp.fsdp_size, sp, world=workers, tp=fsdp.tensor_parallel_size)
        except ValueError as exc:  # the config checks refuse these first; say so rather than fail the plan
            rows.append((role, str(exc)))
            continue
        params = model_params(str(path)) if path else None
        memory = "" if params is None else (
            f", ~{_size(layout.state_bytes_per_rank(params, trained))}/rank of weights"
            f"{' + grads + AdamW' if trained else ''} ({params / 1e6:.1f}M params)")
        rows.append((role, f"{layout.describe()} ({workers} workers){memory}"))
    return rows


def _size(nbytes: float) -> str:
    return f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"


def model_params(spec: str) -> int | None:
    """The parameter count of a local model folder (projections, LM head and an untied embedding, from its
    config), or None when it is not on this machine yet."""
    from pathlib import Path

    from transformers import AutoConfig

    from rlkit.utils.flops import matmul_params_total

    folder = Path(spec).expanduser()
    if not (folder / "config.json").is_file():
        return None
    try:
        config = AutoConfig.from_pretrained(folder)
        text = config.get_text_config()
        return matmul_params_total(config) + (0 if text.tie_word_embeddings else text.hidden_size * text.vocab_size)
    except Exception:  # a plan line must never fail the dry run; the pre-flight names a broken model
        return None


def engine_precision(cfg: RLConfig) -> str:
    """The rollout engine's dtype, `rollout.dtype` resolved."""
    import torch

    from rlkit.rollout.base import engine_dtype

    t = cfg.trainer
    return engine_dtype(cfg.actor_rollout_ref.rollout.dtype,
                        t.device == "cuda" or (t.device == "auto" and torch.cuda.is_available()))


def precision_line(cfg: RLConfig) -> str:
    """The run summary's `precision` row: the actor's compute dtype and the engine's, resolved."""
    from rlkit.utils.cpu_precision import resolved_param_dtype

    t = cfg.trainer
    actor = resolved_param_dtype(cfg.actor_rollout_ref.actor.fsdp_config.param_dtype, t.device,
                                 max(1, int(t.cpus_per_worker)))
    return f"actor {actor}, engine {engine_precision(cfg)}"


def anomaly_settings(cfg: RLConfig, opts: LaunchOptions) -> dict[str, str]:
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


def init_ray(cfg: RLConfig, opts: LaunchOptions, console: Console) -> Any:
    import ray

    from rlkit.controller.cluster import PRIVATE, choose_cluster, record_driver_cluster
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
        kwargs.update({"address": PRIVATE, "num_cpus": opts.num_cpus or os.cpu_count(), "include_dashboard": False,
                       **settings.ray_init_kwargs()})  # fmt: skip
    else:
        kwargs["address"] = target.address
    ray_init = getattr(getattr(cfg, "ray_kwargs", None), "ray_init", None)  # verl's ray_kwargs.ray_init, on top
    kwargs, ignored = merge_ray_init(kwargs, ray_init, joining=not target.private, cli_num_cpus=opts.num_cpus)
    if ignored:
        console.print(ignored, markup=False, highlight=False, soft_wrap=True)
    if target.joined is not None:
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # how `rlkit cluster up` started it
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


def run_training(cfg: RLConfig, opts: LaunchOptions, console: Console | None = None) -> Any:
    """Run a full training job; returns the FitSummary.

    Pre-flight checks run first (before Ray starts). Ctrl-C stops the workers and raises
    TrainingInterrupted (step reached, last complete checkpoint) instead of a traceback.
    """
    from rlkit.debug.runtime import get_mode
    from rlkit.trainer.run.preflight import preflight
    from rlkit.trainer.step.key_checks import check_batch_keys
    from rlkit.trainer.step.rl_trainer import RLTrainer
    from rlkit.utils.status_line import waiting

    console = console or Console()
    print_table(console, resource_plan(cfg))
    console.print(f"rollout backend: [bold]{cfg.actor_rollout_ref.rollout.name}[/bold]")
    with waiting(console, "pre-flight checks (data, model, output folders)..."):
        notes = preflight(cfg).notes
    console.print("pre-flight ok: " + "; ".join(notes), soft_wrap=True, markup=False)
    anomaly_settings(cfg, opts)  # the driver's own checks (rewards, advantages); init_ray passes it to the workers

    def start() -> Any:
        trainer = RLTrainer(cfg)
        if get_mode(opts.debug).enabled:
            trainer.check_keys = True  # workers restarted after a death are checked too
            check_batch_keys(trainer.workers)  # a role's wrong output names the role and key (rlkit/batch_keys.py)
        return trainer

    def describe(trainer: Any, summary: Any) -> None:
        summary.memory = {**(actor_memory(trainer.workers.actor) or {}), **moe_params(trainer.model_path)}
        summary.precision = precision_line(cfg)
        meter = trainer.mfu_meter
        summary.mfu_peak = meter.source if meter is not None else None

    return run_fit(cfg, opts, console, start, describe)


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
