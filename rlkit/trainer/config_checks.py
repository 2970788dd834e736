"""Cross-field checks of a run config: names exist in their registries, sizes divide.

Each failure is a UserError that says which keys disagree and what to change.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlkit.errors import UserError
from rlkit.trainer.config_schema import RLConfig

if TYPE_CHECKING:
    from rlkit.algo.advantages import Needs


def _needs(cfg: RLConfig) -> Needs:
    """What the configured advantage estimator declares it reads (rlkit.algo.advantages.Needs)."""
    from rlkit.algo.advantages import ADV_ESTIMATORS, Needs, estimator_needs

    name = cfg.algorithm.adv_estimator
    return estimator_needs(name) if name in ADV_ESTIMATORS else Needs()


def critic_enabled(cfg: RLConfig) -> bool:
    if cfg.critic.enable is not None:
        return bool(cfg.critic.enable)
    return _needs(cfg).values


def ref_needed(cfg: RLConfig) -> bool:
    """The frozen reference is only loaded when some KL uses it."""
    return bool(cfg.actor_rollout_ref.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward)


def world_size(cfg: RLConfig) -> int:
    return cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node


def check_config(cfg: RLConfig) -> None:
    from rlkit.algo import ADV_ESTIMATORS, KL_CONTROLLERS, KL_ESTIMATORS, LOSS_AGG, POLICY_LOSSES

    actor = cfg.actor_rollout_ref.actor
    for key, registry, name in [
        ("algorithm.adv_estimator", ADV_ESTIMATORS, cfg.algorithm.adv_estimator),
        ("actor_rollout_ref.actor.policy_loss", POLICY_LOSSES, actor.policy_loss),
        ("actor_rollout_ref.actor.loss_agg_mode", LOSS_AGG, actor.loss_agg_mode),
        ("actor_rollout_ref.actor.kl_loss_type", KL_ESTIMATORS, actor.kl_loss_type),
        ("algorithm.kl_penalty", KL_ESTIMATORS, cfg.algorithm.kl_penalty),
        ("algorithm.kl_ctrl.type", KL_CONTROLLERS, cfg.algorithm.kl_ctrl.type),
        ("critic.loss_agg_mode", LOSS_AGG, cfg.critic.loss_agg_mode),
    ]:
        if name not in registry:
            raise UserError(f"{key}='{name}' is not registered; choose one of {registry.names()}")
    if cfg.data.truncation not in ("error", "left", "right", "filter"):
        raise UserError(f"data.truncation='{cfg.data.truncation}' must be error | left | right | filter")
    if cfg.reward_model.enable:
        raise UserError(
            "reward_model.enable=true: model-based rewards are not in this release; "
            "use rule/code scorers or custom_reward_function.path"
        )
    if _needs(cfg).values and not critic_enabled(cfg):
        raise UserError(f"algorithm.adv_estimator={cfg.algorithm.adv_estimator} needs a critic: set critic.enable=true")
    if not cfg.data.train_files:
        raise UserError("data.train_files is empty: pass data.train_files=PATH.parquet (make one with `rlkit data`)")

    n = cfg.actor_rollout_ref.rollout.n
    ws = world_size(cfg)
    bsz, mini = cfg.data.train_batch_size, actor.ppo_mini_batch_size
    if bsz < 1 or mini < 1 or actor.ppo_micro_batch_size_per_gpu < 1:
        raise UserError(
            "data.train_batch_size, actor.ppo_mini_batch_size and actor.ppo_micro_batch_size_per_gpu must be >= 1"
        )
    if _needs(cfg).groups and n < 2:
        raise UserError(
            f"algorithm.adv_estimator={cfg.algorithm.adv_estimator} compares samples of the same prompt: "
            f"set actor_rollout_ref.rollout.n >= 2 (now {n})"
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
    if critic_enabled(cfg):
        cmini = cfg.critic.ppo_mini_batch_size or mini
        if cmini > bsz or bsz % cmini or (cmini * n) % ws:
            raise UserError(
                f"critic.ppo_mini_batch_size={cmini} must divide data.train_batch_size={bsz} and "
                f"critic.ppo_mini_batch_size * rollout.n must split over {ws} workers"
            )
    check_tensor_parallel(cfg)
    if cfg.trainer.device not in ("auto", "cpu", "cuda"):
        raise UserError(f"trainer.device='{cfg.trainer.device}' must be auto | cpu | cuda")
    if cfg.algorithm.filter_groups.enable and n < 2:
        raise UserError("algorithm.filter_groups.enable needs actor_rollout_ref.rollout.n >= 2")


def _largest_divisor_at_most(total: int, cap: int) -> int:
    return max(d for d in range(1, min(total, cap) + 1) if total % d == 0)


def check_tensor_parallel(cfg: RLConfig) -> None:
    """TP splits the rollout workers into groups of `tp` ranks, each group one engine (vLLM only).
    Also called by the rollout worker itself, for configs that did not come through `load_config`."""
    rollout = cfg.actor_rollout_ref.rollout
    tp = rollout.tensor_model_parallel_size
    if tp == 1:
        return
    key = "actor_rollout_ref.rollout.tensor_model_parallel_size"
    if rollout.name != "vllm":
        raise UserError(f"{key}={tp} needs rollout.name=vllm (the '{rollout.name}' backend runs one full model "
                        "per worker); set it to 1 or use vllm")
    workers = world_size(cfg)
    if cfg.trainer.one_step_off_policy:  # the rollout has its own group
        workers = cfg.trainer.rollout_workers_per_node * cfg.trainer.nnodes
    if workers % tp:
        raise UserError(f"{key}={tp} must divide the {workers} rollout workers")
    prompts = cfg.data.train_batch_size * rollout.n
    if prompts % (workers // tp):
        raise UserError(f"{key}={tp}: train_batch_size * rollout.n = {prompts} must split over the "
                        f"{workers // tp} TP groups")
