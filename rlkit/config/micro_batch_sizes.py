"""The micro-batch keys of the model passes (verl's names and meaning), settled to one value per key.

    pass                 section                    rows per forward                   token budget (dynamic)
    actor update         actor_rollout_ref.actor    ppo_micro_batch_size_per_gpu       ppo_max_token_len_per_gpu
    old log-probs        actor_rollout_ref.rollout  log_prob_micro_batch_size_per_gpu  log_prob_max_token_len_per_gpu
    reference log-probs  actor_rollout_ref.ref      log_prob_micro_batch_size_per_gpu  log_prob_max_token_len_per_gpu
    critic update        critic                     ppo_micro_batch_size_per_gpu       ppo_max_token_len_per_gpu
    critic values        critic                     forward_micro_batch_size_per_gpu   forward_max_token_len_per_gpu

The switch is `use_dynamic_bsz` (`log_prob_use_dynamic_bsz` for the log-prob passes); a null switch or budget of a
log-prob pass follows the actor's, the critic's switch too (verl's `${oc.select:actor_rollout_ref.actor...}`
defaults). Each row count also has verl's deprecated global spelling, the key without `_per_gpu`: rows over all
workers, divided by their count (floor, as verl). Every worker holds its own share of the rows, so the
workers are the data shards; with Ulysses a group's forward runs its `sp` workers' rows together, so one
forward holds global / (workers / sp) rows, verl's division. Setting both spellings is an error.

`settle_micro_batches` (in `finalize`) fills every null in and clears the global spellings it translated, so
`--dry-run` prints what runs, the workers read one value per key, and a printed config finalizes again unchanged.
"""

from __future__ import annotations

from typing import Any

from rlkit.config.checks import world_size
from rlkit.config.schema import RLConfig
from rlkit.errors import UserError

ACTOR_MICRO_ROWS = 4  # ppo_micro_batch_size_per_gpu of the actor and the critic when nothing sets it
REF_MICRO_ROWS = 8  # the reference's log_prob_micro_batch_size_per_gpu when nothing sets it


def per_worker_rows(section: str, node: Any, key: str, fallback: int, workers: int) -> None:
    """`<key>_per_gpu` from itself, or from the global `<key>` divided over the workers, or `fallback`;
    the global key is cleared once translated."""
    glob, per = getattr(node, key), getattr(node, f"{key}_per_gpu")
    if glob is not None and per is not None:
        raise UserError(f"{section}.{key}={glob} and {section}.{key}_per_gpu={per} are both set: {key} is verl's "
                        f"deprecated global spelling (rows over all workers); keep {key}_per_gpu and delete {key}")
    if glob is not None:
        per = glob // workers
        if per < 1:
            raise UserError(f"{section}.{key}={glob} is less than one row per worker over the {workers} workers "
                            f"(trainer.nnodes * trainer.n_gpus_per_node); set it to >= {workers} or set "
                            f"{section}.{key}_per_gpu instead")
    setattr(node, f"{key}_per_gpu", fallback if per is None else per)
    setattr(node, key, None)


def settle_micro_batches(cfg: RLConfig) -> None:
    """Every pass's rows per forward, dynamic switch and token budget, as the module docstring lays out."""
    workers = world_size(cfg)
    arr, critic = cfg.actor_rollout_ref, cfg.critic
    actor = arr.actor
    per_worker_rows("actor_rollout_ref.actor", actor, "ppo_micro_batch_size", ACTOR_MICRO_ROWS, workers)
    per_worker_rows("actor_rollout_ref.rollout", arr.rollout, "log_prob_micro_batch_size",
                    actor.ppo_micro_batch_size_per_gpu, workers)
    per_worker_rows("actor_rollout_ref.ref", arr.ref, "log_prob_micro_batch_size", REF_MICRO_ROWS, workers)
    for log_prob in (arr.rollout, arr.ref):
        if log_prob.log_prob_use_dynamic_bsz is None:
            log_prob.log_prob_use_dynamic_bsz = actor.use_dynamic_bsz
        if log_prob.log_prob_max_token_len_per_gpu is None:
            log_prob.log_prob_max_token_len_per_gpu = actor.ppo_max_token_len_per_gpu
    if critic.forward_micro_batch_size is None and critic.forward_micro_batch_size_per_gpu is None:
        critic.forward_micro_batch_size = critic.ppo_micro_batch_size  # verl: the forward follows the update's
    per_worker_rows("critic", critic, "ppo_micro_batch_size", ACTOR_MICRO_ROWS, workers)
    per_worker_rows("critic", critic, "forward_micro_batch_size", critic.ppo_micro_batch_size_per_gpu, workers)
    if critic.use_dynamic_bsz is None:
        critic.use_dynamic_bsz = actor.use_dynamic_bsz
    if critic.forward_max_token_len_per_gpu is None:
        critic.forward_max_token_len_per_gpu = critic.ppo_max_token_len_per_gpu
