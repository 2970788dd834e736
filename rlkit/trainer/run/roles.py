"""Each worker role's constructor arguments, taken from the run config: its own section plus what it reads.

The workers never see the whole `RLConfig`; this is the one place that picks their inputs out
of it, so a role's dependencies show in its constructor and here, nowhere else. Model paths
arrive resolved (a local HF folder), so no worker resolves an alias or downloads.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

from rlkit.algo.rollout_correction import RolloutCorrection
from rlkit.config.schema import ModelConfig, RLConfig
from rlkit.controller import ClassWithInitArgs, Sibling

if TYPE_CHECKING:
    from rlkit.trainer.run.run_plan import Layout, RunPlan


def policy_model(cfg: RLConfig, model_path: str) -> ModelConfig:
    """actor_rollout_ref.model with `path` replaced by the resolved local folder."""
    return dataclasses.replace(cfg.actor_rollout_ref.model, path=str(model_path))


def actor_role(cfg: RLConfig, model_path: str, total_steps: int, plan: RunPlan | None = None) -> ClassWithInitArgs:
    """The actor, with the rollout's temperature and the micro-batching of its old-log-prob pass (rollout.log_prob_*:
    verl's keys of that pass live in the rollout section)."""
    from rlkit.trainer.run.run_plan import RunPlan
    from rlkit.workers.actor import ActorWorker
    from rlkit.workers.micro_batch import MicroBatching

    arr, algo = cfg.actor_rollout_ref, cfg.algorithm
    rollout = arr.rollout
    log_prob = MicroBatching(rollout.log_prob_micro_batch_size_per_gpu, rollout.log_prob_use_dynamic_bsz,
                             rollout.log_prob_max_token_len_per_gpu)
    return ClassWithInitArgs(
        ActorWorker, arr.actor, policy_model(cfg, model_path), total_steps=total_steps, rollout_n=rollout.n,
        temperature=rollout.temperature, seed=cfg.trainer.seed,
        rollout_correction=RolloutCorrection.from_config(algo), log_prob=log_prob,
        distillation=cfg.distillation.distillation_loss if cfg.distillation.enabled else None,
        sum_pi_squared=(plan or RunPlan.of(cfg)).needs.sum_pi_squared,
    )


def ref_role(cfg: RLConfig, model_path: str) -> ClassWithInitArgs:
    from rlkit.workers.actor import RefWorker

    arr = cfg.actor_rollout_ref
    return ClassWithInitArgs(RefWorker, arr.ref, policy_model(cfg, model_path), temperature=arr.rollout.temperature,
                             logits_chunk_size=arr.actor.logits_chunk_size)


def teacher_role(cfg: RLConfig, model_path: str) -> ClassWithInitArgs:
    """The local distillation teachers (folders resolved), frozen as the reference is, scoring at the rollout's
    temperature; top-k when the loss reads it."""
    from rlkit.algo.distill_loss import DISTILL_LOSSES
    from rlkit.trainer.step.teacher_stage import local_teacher_paths
    from rlkit.workers.teacher import TeacherWorker

    arr, loss = cfg.actor_rollout_ref, cfg.distillation.distillation_loss
    topk = loss.topk if DISTILL_LOSSES.get(loss.loss_mode).topk else None
    return ClassWithInitArgs(TeacherWorker, local_teacher_paths(cfg), arr.ref, policy_model(cfg, model_path),
                             temperature=arr.rollout.temperature, logits_chunk_size=arr.actor.logits_chunk_size,
                             topk=topk)


def critic_role(cfg: RLConfig, model_path: str, total_steps: int) -> ClassWithInitArgs:
    """The critic's backbone is critic.model.path, or the policy's (already resolved) when it names the same."""
    from rlkit.workers.critic import CriticWorker

    arr = cfg.actor_rollout_ref
    path = cfg.critic.model.path
    if path is None or path == arr.model.path:
        path = str(model_path)
    else:  # a folder, a .gguf, an alias or a hub id, as for the policy
        from rlkit.models.resolve import resolve_model_path

        path = str(resolve_model_path(path))
    critic = dataclasses.replace(cfg.critic, model=dataclasses.replace(cfg.critic.model, path=path))
    return ClassWithInitArgs(CriticWorker, critic, total_steps=total_steps, rollout_n=arr.rollout.n,
                             attn_implementation=arr.model.attn_implementation,
                             use_remove_padding=arr.model.use_remove_padding)


def reward_model_role(cfg: RLConfig, model_path: str) -> ClassWithInitArgs:
    """The classifier RM: the reward_model section with `model.path` and `model.input_tokenizer` resolved to local
    folders (an input_tokenizer naming the policy's model is the policy's resolved folder, `model_path`)."""
    from rlkit.models.resolve import resolve_model_path
    from rlkit.workers.reward_model import RewardModelWorker

    rm = cfg.reward_model
    tok = rm.model.input_tokenizer
    if tok is not None:
        tok = str(model_path) if tok == cfg.actor_rollout_ref.model.path else str(resolve_model_path(tok))
    model = dataclasses.replace(rm.model, path=str(resolve_model_path(rm.model.path)), input_tokenizer=tok)
    return ClassWithInitArgs(RewardModelWorker, dataclasses.replace(rm, model=model))


def rollout_role(cfg: RLConfig, model_path: str, colocated: bool) -> ClassWithInitArgs:
    """The rollout worker: its own config section; colocated, the actor of its process as weight source.
    (A separate engine never sleeps: finalize turns rollout.free_cache_engine off in that mode.)"""
    from rlkit.workers.rollout_worker import RolloutWorker

    actor = cfg.actor_rollout_ref.actor
    rollout, replay = cfg.actor_rollout_ref.rollout, actor.router_replay and actor.router_replay_from == "rollout"
    if colocated:
        return ClassWithInitArgs(RolloutWorker, rollout, str(model_path), actor=Sibling("actor"), router_replay=replay)
    return ClassWithInitArgs(RolloutWorker, rollout, str(model_path), router_replay=replay)


def role_spec(cfg: RLConfig, role: str, model_path: str, total_steps: int, plan: RunPlan | None = None,
              colocated: bool = True) -> ClassWithInitArgs:
    """One role's constructor arguments (`plan`: the run's, computed when None)."""
    build: dict[str, Callable[[], ClassWithInitArgs]] = {
        "actor": lambda: actor_role(cfg, model_path, total_steps, plan),
        "rollout": lambda: rollout_role(cfg, model_path, colocated),
        "ref": lambda: ref_role(cfg, model_path),
        "critic": lambda: critic_role(cfg, model_path, total_steps),
        "reward_model": lambda: reward_model_role(cfg, model_path),
        "teacher": lambda: teacher_role(cfg, model_path),
    }
    return build[role]()


def role_specs(cfg: RLConfig, layout: Layout, model_path: str, total_steps: int,
               plan: RunPlan | None = None) -> list[dict[str, ClassWithInitArgs]]:
    """Each group's roles with their constructor arguments."""
    colocated = not layout.separate_rollout
    return [{role: role_spec(cfg, role, model_path, total_steps, plan, colocated) for role in group.roles}
            for group in layout.groups]
