"""The RL trainer kind (`rlkit train grpo|ppo|...`, or no preset as verl's main_ppo): its resource plan, its
pre-flight checks, the trainer it starts and the run summary's lines. The run around them is every kind's
(rlkit/trainer/run/launch.py `run_kind`)."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from rlkit.config.schema import RLConfig


def plan(cfg: RLConfig) -> Table:
    """What will run where (printed by --dry-run and at start-up): the run plan's groups (RunPlan)."""
    from rlkit.reward.mix import describe as describe_reward
    from rlkit.trainer.run.run_plan import RunPlan
    from rlkit.utils.cpu_precision import plan_row

    t = cfg.trainer
    rollout = cfg.actor_rollout_ref.rollout
    name = {"rollout": f"rollout ({rollout.name})"}
    run = RunPlan.of(cfg)
    trainer, *separate = run.layout.groups  # the layout the workers are built from
    table = Table(title="resource plan", show_header=False)
    table.add_row("workers", f"{t.nnodes} node(s) x {t.n_gpus_per_node} = {run.world_size} (device: {t.device})")
    table.add_row("colocated roles per worker", ", ".join(name.get(r, r) for r in trainer.roles))
    for role, line in mesh_rows(cfg, trainer.roles, trainer.nnodes * trainer.per_node):
        table.add_row(f"{role} mesh", line)
    for group in separate:  # one-step-off: the engines in processes of their own
        table.add_row(f"separate {', '.join(name.get(r, r) for r in group.roles)} workers",
                      f"{group.nnodes} node(s) x {group.per_node} = {group.nnodes * group.per_node}, "
                      f"each a GPU (or {group.cpus_per_process:g} CPU without one)")
    actor = cfg.actor_rollout_ref.actor
    bsz = cfg.data.train_batch_size
    table.add_row("sequences per step", f"{bsz} prompts x n={rollout.n} = {bsz * rollout.n}")
    table.add_row("optimizer steps per step", str(bsz // actor.ppo_mini_batch_size * actor.ppo_epochs))
    table.add_row("advantage estimator", cfg.algorithm.adv_estimator)
    table.add_row("policy loss", f"{actor.policy_loss} ({actor.loss_agg_mode})")
    threads = max(1, int(t.cpus_per_worker))  # the workers' torch threads: their measurement is the one cached
    table.add_row("actor compute dtype", plan_row(actor.fsdp_config.param_dtype, t.device, threads))
    table.add_row("rollout backend", str(rollout.name))
    table.add_row("rollout engine dtype", f"auto -> {engine_precision(cfg)}" if rollout.dtype == "auto"
                  else rollout.dtype)
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
            layout = ParallelLayout.of(fsdp.fsdp_size, sp, world=workers, tp=fsdp.tensor_parallel_size,
                                       ep=fsdp.expert_parallel_size)
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


def preflight(cfg: RLConfig, allow_download: bool = False) -> list[str]:
    """Every check of rlkit/trainer/run/preflight.py; UserError listing the problems."""
    from rlkit.trainer.run.preflight import preflight as run_checks

    return run_checks(cfg, allow_download).notes


def start(cfg: RLConfig, opts: Any) -> Any:
    """The RL trainer (its workers built); with --debug every worker call's output is checked."""
    from rlkit.debug.runtime import get_mode
    from rlkit.trainer.step.key_checks import check_batch_keys
    from rlkit.trainer.step.rl_trainer import RLTrainer

    trainer = RLTrainer(cfg)
    if get_mode(opts.debug).enabled:
        trainer.check_keys = True  # workers restarted after a death are checked too
        check_batch_keys(trainer.workers)  # a role's wrong output names the role and key (rlkit/batch_keys.py)
    return trainer


def describe(trainer: Any, summary: Any, cfg: RLConfig) -> None:
    """The run summary's memory, precision and MFU lines."""
    from rlkit.trainer.run.run_summary import actor_memory, moe_params

    summary.memory = {**(actor_memory(trainer.workers.actor) or {}), **moe_params(trainer.model_path)}
    summary.precision = precision_line(cfg)
    meter = trainer.mfu_meter
    summary.mfu_peak = meter.source if meter is not None else None


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
