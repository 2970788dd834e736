"""Each worker role's constructor arguments, taken from the run config: its own section plus what it reads.

The workers never see the whole `RLConfig`; this is the one place that picks their inputs out
of it, so a role's dependencies show in its constructor and here, nowhere else. Model paths
arrive resolved (a local HF folder), so no worker resolves an alias or downloads.
"""

from __future__ import annotations

import dataclasses

from rlkit.algo.rollout_correction import RolloutCorrection
from rlkit.algo.run_needs import run_needs
from rlkit.config.schema import ModelConfig, RLConfig
from rlkit.controller import ClassWithInitArgs


def policy_model(cfg: RLConfig, model_path: str) -> ModelConfig:
    """actor_rollout_ref.model with `path` replaced by the resolved local folder."""
    return dataclasses.replace(cfg.actor_rollout_ref.model, path=str(model_path))


def actor_role(cfg: RLConfig, model_path: str, total_steps: int) -> ClassWithInitArgs:
    """The actor, with the rollout's temperature and the micro-batching of its old-log-prob pass (rollout.log_prob_*:
    verl's keys of that pass live in the rollout section)."""
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
        sum_pi_squared=run_needs(cfg).sum_pi_squared,
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
