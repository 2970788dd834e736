"""Cross-field checks of a run config: sizes divide, switches agree.

Each failure is a UserError that says which keys disagree and what to change. Checks that need
a registry (names, what an algorithm entry needs, which backends run tensor-parallel) belong to
the layers that own the registries; they reach `finalize` as hooks (rlkit.trainer.run.run_config).
"""

from __future__ import annotations

from typing import Any

from rlkit.config.profiler import RoleProfilerConfig, check_profiler
from rlkit.config.schema import RLConfig
from rlkit.errors import UserError


def world_size(cfg: Any) -> int:
    """Trainer processes of any trainer kind's config (RL, SFT, DPO): its `trainer` section's nodes x devices."""
    return cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node


def check_config(cfg: RLConfig) -> None:
    """Sizes and switches; `critic.enable` is already resolved (null -> what the estimator needs) by a hook."""
    actor = cfg.actor_rollout_ref.actor
    if not cfg.data.train_files:
        raise UserError("data.train_files is empty: pass data.train_files=PATH.parquet (make one with `rlkit data`)")

    n = cfg.actor_rollout_ref.rollout.n
    ws = world_size(cfg)
    bsz, mini = cfg.data.train_batch_size, actor.ppo_mini_batch_size
    if bsz < 1 or mini < 1 or actor.ppo_micro_batch_size_per_gpu < 1:
        raise UserError(
            "data.train_batch_size, actor.ppo_mini_batch_size and actor.ppo_micro_batch_size_per_gpu must be >= 1"
        )
    if mini > bsz or bsz % mini:
        raise UserError(
            f"actor_rollout_ref.actor.ppo_mini_batch_size={mini} must divide data.train_batch_size={bsz}; "
            f"e.g. set ppo_mini_batch_size={_largest_divisor_at_most(bsz, mini)}"
        )
    if (mini * n) % ws:
        raise UserError(
            f"ppo_mini_batch_size * rollout.n = {mini * n} sequences must split evenly over "
            f"{ws} workers (trainer.nnodes * trainer.n_gpus_per_node); change ppo_mini_batch_size or the worker count"
        )
    if cfg.critic.enable:
        cmini = cfg.critic.ppo_mini_batch_size or mini
        if cmini > bsz or bsz % cmini or (cmini * n) % ws:
            raise UserError(
                f"critic.ppo_mini_batch_size={cmini} must divide data.train_batch_size={bsz} and "
                f"critic.ppo_mini_batch_size * rollout.n must split over {ws} workers"
            )
    check_tensor_parallel(cfg, tp_backends=None)
    check_sequence_parallel(cfg)
    check_fsdp_size(cfg)
    if cfg.trainer.device not in ("auto", "cpu", "cuda"):
        raise UserError(f"trainer.device='{cfg.trainer.device}' must be auto | cpu | cuda")
    if cfg.algorithm.filter_groups.enable and n < 2:
        raise UserError("algorithm.filter_groups.enable needs actor_rollout_ref.rollout.n >= 2")
    if cfg.data.gen_batch_size != bsz and not cfg.algorithm.filter_groups.enable:
        raise UserError(f"data.gen_batch_size={cfg.data.gen_batch_size} differs from data.train_batch_size={bsz}, "
                        "but only dynamic sampling (algorithm.filter_groups.enable=true) generates in batches of "
                        "another size; enable it or drop data.gen_batch_size")
    if cfg.actor_rollout_ref.rollout.multi_turn.enable and not cfg.data.return_raw_chat:
        raise UserError("actor_rollout_ref.rollout.multi_turn.enable renders each prompt's chat messages with the "
                        "tool schemas, so it needs data.return_raw_chat=true")
    check_profiler(cfg.global_profiler, profiled_roles(cfg), cfg.trainer.device)
    model = cfg.actor_rollout_ref.model
    if model.fused_lm_head and not model.response_logits_only:
        raise UserError("actor_rollout_ref.model.fused_lm_head=true needs actor_rollout_ref.model.response_logits_only="
                        "true (the fused head computes the response tokens' log-probs only)")


def profiled_roles(cfg: RLConfig) -> dict[str, RoleProfilerConfig]:
    """Each role section's `profiler`, by its config key."""
    arr = cfg.actor_rollout_ref
    return {"actor_rollout_ref.actor": arr.actor.profiler, "actor_rollout_ref.ref": arr.ref.profiler,
            "actor_rollout_ref.rollout": arr.rollout.profiler, "critic": cfg.critic.profiler,
            "reward_model": cfg.reward_model.profiler}


def check_sequence_parallel(cfg: RLConfig) -> None:
    """Ulysses SP groups are `sp` consecutive workers of a role's group: `sp` must divide the worker count (the
    model's head counts are checked by the pre-flight and by the worker, which read the model's config)."""
    ws = world_size(cfg)
    sizes = {
        "actor_rollout_ref.actor": cfg.actor_rollout_ref.actor.ulysses_sequence_parallel_size,
        "actor_rollout_ref.ref": cfg.actor_rollout_ref.ref.ulysses_sequence_parallel_size,
        "critic": cfg.critic.ulysses_sequence_parallel_size,
    }
    for key, sp in sizes.items():
        if sp < 1 or ws % sp:
            raise UserError(f"{key}.ulysses_sequence_parallel_size={sp} must be >= 1 and divide the {ws} workers "
                            "(trainer.nnodes * trainer.n_gpus_per_node)")


def check_fsdp_size(cfg: RLConfig) -> None:
    """verl's hybrid sharding, rlkit's tensor and expert parallel: a role's TP groups are `tensor_parallel_size`
    consecutive workers of its worker group (the trainer's workers; a pooled reward model's own), its FSDP groups
    `fsdp_size` of the data-parallel workers left (workers / tp) and its EP groups `expert_parallel_size` consecutive
    workers of an FSDP group, so each size must divide what it splits.
    Roles that are off: unchecked."""
    ws = world_size(cfg)
    rm = cfg.reward_model
    rm_ws = rm.nnodes * rm.n_gpus_per_node if rm.enable_resource_pool else ws
    arr = cfg.actor_rollout_ref
    sizes = {  # key -> (fsdp section, workers, Ulysses size)
        "actor_rollout_ref.actor.fsdp_config": (arr.actor.fsdp_config, ws, arr.actor.ulysses_sequence_parallel_size),
        "actor_rollout_ref.ref.fsdp_config": (arr.ref.fsdp_config, ws, arr.ref.ulysses_sequence_parallel_size),
    }
    if cfg.critic.enable:
        sizes["critic.fsdp_config"] = (cfg.critic.fsdp_config, ws, cfg.critic.ulysses_sequence_parallel_size)
    if rm.enable:
        sizes["reward_model.model.fsdp_config"] = (rm.model.fsdp_config, rm_ws, 1)
    for key, (fsdp, workers, sp) in sizes.items():
        tp, size = fsdp.tensor_parallel_size, fsdp.fsdp_size
        if workers % tp:
            raise UserError(f"{key}.tensor_parallel_size={tp} must divide the {workers} workers of the role; set "
                            f"1 or a divisor of {workers}")
        dp = workers // tp
        if 0 < size < dp and dp % size:  # -1 or >= the workers: one group (verl's reading)
            of = f" ({workers} workers / tensor_parallel_size={tp})" if tp > 1 else " of the role"
            raise UserError(f"{key}.fsdp_size={size} must divide the {dp} workers{of}; set -1 (one "
                            f"FSDP group over all of them) or a divisor of {dp}")
        if tp > 1 and sp > 1:
            raise UserError(f"{key}.tensor_parallel_size={tp} with the role's ulysses_sequence_parallel_size={sp}: "
                            "both would split the same attention heads; use one of them")
        check_expert_parallel(key, fsdp.expert_parallel_size, dp, size)
    if rm.enable and rm.model.fsdp_config.tensor_parallel_size > 1:
        raise UserError("reward_model.model.fsdp_config.tensor_parallel_size > 1: the classifier reward model calls "
                        "its model on each worker's own rows, which a TP group does not share; use 1")
    if (arr.model.lora_rank > 0 or arr.model.lora_adapter_path) and arr.actor.fsdp_config.expert_parallel_size > 1:
        raise UserError("actor_rollout_ref.actor.fsdp_config.expert_parallel_size > 1 with LoRA: peft's adapters on "
                        "the fused experts are not split over the expert-parallel group; use expert_parallel_size=1 "
                        "with LoRA")


def check_expert_parallel(key: str, ep: int, dp: int, fsdp_size: int) -> None:
    """Expert-parallel groups are `ep` consecutive ranks of an FSDP group (the `dp` workers left by TP, or verl's
    `fsdp_size` of them; a Ulysses group's ranks among them): ep divides that group."""
    if ep == 1:
        return
    group = fsdp_size if 0 < fsdp_size < dp else dp
    if group % ep:
        what = f"fsdp_size={fsdp_size}" if group != dp else f"the {dp} data-parallel workers"
        raise UserError(f"{key}.expert_parallel_size={ep} must divide {what} (experts are split over groups of ep "
                        f"consecutive data-parallel workers); set 1 or a divisor of {group}")


def _largest_divisor_at_most(total: int, cap: int) -> int:
    return max(d for d in range(1, min(total, cap) + 1) if total % d == 0)


def separate_engines(cfg: RLConfig) -> tuple[int, int]:
    """(nodes, engine processes per node) of the separate engines (one-step-off, fully async): rollout.nnodes
    (0: the trainer's nodes) x rollout.n_gpus_per_node (0: trainer.rollout_workers_per_node)."""
    r, t = cfg.actor_rollout_ref.rollout, cfg.trainer
    return r.nnodes or t.nnodes, r.n_gpus_per_node or t.rollout_workers_per_node


def check_tensor_parallel(cfg: RLConfig, tp_backends: list[str] | None) -> None:
    """TP splits the rollout workers into groups of `tp` ranks, each group one engine. `tp_backends`: the
    backends that declare `tensor_parallel` (the rollout package knows them; None skips that part).
    Also called when the workers are built, for configs that did not come through `load_config`."""
    rollout = cfg.actor_rollout_ref.rollout
    tp = rollout.tensor_model_parallel_size
    if tp == 1:
        return
    key = "actor_rollout_ref.rollout.tensor_model_parallel_size"
    able = tp_backends or []
    if tp_backends is not None and rollout.name not in able:
        raise UserError(f"{key}={tp} needs rollout.name={' | '.join(able)} (the '{rollout.name}' backend runs one "
                        f"full model per worker); set it to 1 or use {' | '.join(able)}")
    workers = world_size(cfg)
    if cfg.trainer.separate_rollout:  # the rollout has its own group
        nodes, per_node = separate_engines(cfg)
        workers = nodes * per_node
    if workers % tp:
        raise UserError(f"{key}={tp} must divide the {workers} rollout workers")
    prompts = cfg.data.train_batch_size * rollout.n
    if prompts % (workers // tp):
        raise UserError(f"{key}={tp}: train_batch_size * rollout.n = {prompts} must split over the "
                        f"{workers // tp} TP groups")
