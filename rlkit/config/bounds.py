"""Range checks of single config values, declared as a table: a negative learning rate or a
zero batch size stops the run at start-up with the key and the value, before anything runs
(a negative lr would otherwise train "backwards" without a word).

Cross-field checks (sizes that must divide) live in checks.py; registry names in the layers
that own the registries (finalize hooks, rlkit.trainer.run.run_config).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlkit.errors import UserError


@dataclass(frozen=True)
class Bound:
    """`value <op> limit` must hold; `None` passes when `optional` (the key's "use the default" value)."""

    limit: float
    op: Callable[[Any, Any], bool]
    words: str
    optional: bool = False


AT_LEAST_1 = Bound(1, operator.ge, ">= 1")
AT_LEAST_1_OR_NULL = Bound(1, operator.ge, ">= 1 (or null)", optional=True)
NON_NEGATIVE = Bound(0, operator.ge, ">= 0")
POSITIVE = Bound(0, operator.gt, "> 0")
#: a row limit: N >= 1, or -1 (verl's "all") or null
ROW_LIMIT = Bound(1, lambda value, limit: value == -1 or value >= limit, ">= 1, or -1 / null for all", optional=True)

_A = "actor_rollout_ref.actor."
BOUNDS: dict[str, Bound] = {
    "data.train_batch_size": AT_LEAST_1,
    "data.val_batch_size": AT_LEAST_1_OR_NULL,
    "data.gen_batch_size": AT_LEAST_1_OR_NULL,
    "data.train_max_samples": ROW_LIMIT,
    "data.val_max_samples": ROW_LIMIT,
    "data.max_prompt_length": AT_LEAST_1,
    "data.max_response_length": AT_LEAST_1,
    _A + "ppo_mini_batch_size": AT_LEAST_1,
    _A + "ppo_micro_batch_size": AT_LEAST_1_OR_NULL,
    _A + "ppo_micro_batch_size_per_gpu": AT_LEAST_1_OR_NULL,
    _A + "ppo_max_token_len_per_gpu": AT_LEAST_1,
    _A + "ppo_epochs": AT_LEAST_1,
    _A + "logits_chunk_size": AT_LEAST_1,
    _A + "optim.lr": NON_NEGATIVE,
    _A + "optim.weight_decay": NON_NEGATIVE,
    _A + "optim.lr_warmup_steps_ratio": NON_NEGATIVE,
    _A + "clip_ratio": NON_NEGATIVE,
    _A + "kl_loss_coef": NON_NEGATIVE,
    _A + "tau_pos": POSITIVE,
    _A + "tau_neg": POSITIVE,
    _A + "clip_cov_ratio": POSITIVE,
    _A + "kl_cov_ratio": POSITIVE,
    _A + "ppo_kl_coef": NON_NEGATIVE,
    _A + "dro_beta": Bound(0, operator.gt, "> 0 (or null)", optional=True),
    _A + "vespo_k_pos": NON_NEGATIVE,
    _A + "vespo_k_neg": NON_NEGATIVE,
    _A + "vespo_lambda_pos": NON_NEGATIVE,
    _A + "vespo_lambda_neg": NON_NEGATIVE,
    _A + "grad_clip": POSITIVE,
    "actor_rollout_ref.ref.log_prob_micro_batch_size": AT_LEAST_1_OR_NULL,
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": AT_LEAST_1_OR_NULL,
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu": AT_LEAST_1_OR_NULL,
    "actor_rollout_ref.rollout.log_prob_micro_batch_size": AT_LEAST_1_OR_NULL,
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": AT_LEAST_1_OR_NULL,
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu": AT_LEAST_1_OR_NULL,
    "actor_rollout_ref.rollout.n": AT_LEAST_1,
    "actor_rollout_ref.rollout.val_kwargs.n": AT_LEAST_1,
    "critic.optim.lr": NON_NEGATIVE,
    "critic.optim.weight_decay": NON_NEGATIVE,
    "critic.ppo_mini_batch_size": AT_LEAST_1_OR_NULL,
    "critic.ppo_micro_batch_size": AT_LEAST_1_OR_NULL,
    "critic.ppo_micro_batch_size_per_gpu": AT_LEAST_1_OR_NULL,
    "critic.ppo_max_token_len_per_gpu": AT_LEAST_1,
    "critic.forward_micro_batch_size": AT_LEAST_1_OR_NULL,
    "critic.forward_micro_batch_size_per_gpu": AT_LEAST_1_OR_NULL,
    "critic.forward_max_token_len_per_gpu": AT_LEAST_1_OR_NULL,
    "critic.ppo_epochs": AT_LEAST_1_OR_NULL,
    "critic.grad_clip": POSITIVE,
    "reward_model.num_workers": AT_LEAST_1,
    "reward_model.timeout_s": POSITIVE,
    "reward_model.micro_batch_size_per_gpu": AT_LEAST_1,
    "reward_model.max_length": AT_LEAST_1_OR_NULL,
    "reward_model.nnodes": AT_LEAST_1,
    "reward_model.n_gpus_per_node": AT_LEAST_1,
    "reward_model.cpus_per_worker": POSITIVE,
    "algorithm.kl_ctrl.kl_coef": NON_NEGATIVE,
    "trainer.nnodes": AT_LEAST_1,
    "trainer.n_gpus_per_node": AT_LEAST_1,
    "trainer.cpus_per_worker": POSITIVE,
    "trainer.total_epochs": AT_LEAST_1,
    "trainer.critic_warmup": NON_NEGATIVE,
    "trainer.max_worker_restarts": NON_NEGATIVE,
    "trainer.total_training_steps": AT_LEAST_1_OR_NULL,
    "trainer.max_actor_ckpt_to_keep": AT_LEAST_1_OR_NULL,
    "trainer.staleness_threshold": NON_NEGATIVE,
    "trainer.log_val_generations": NON_NEGATIVE,
    "trainer.partial_rollout_segment": NON_NEGATIVE,
    "trainer.rollout_chunk_prompts": AT_LEAST_1,
}


def lookup(cfg: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


def check_bounds(cfg: Any, bounds: dict[str, Bound] | None = None) -> None:
    """Raise UserError for the first value out of its range: "KEY=VALUE must be >= 1"."""
    for key, bound in (bounds or BOUNDS).items():
        value = lookup(cfg, key)
        if value is None and bound.optional:
            continue
        bad = value is None or isinstance(value, bool) or not isinstance(value, (int, float))
        if not bad:
            bad = math.isnan(value) or not bound.op(value, bound.limit)
        if bad:
            raise UserError(f"{key}={value} must be {bound.words}; fix it in your overrides or --config file")
