"""A plugin as a user writes one: an estimator, a policy loss and a loss-aggregation mode registered at
import time, outside rlkit, each with its `@needs`. tests/trainer/test_plugin_algorithm.py trains with them;
the worker processes import this module because the driver registered entries from it."""

from __future__ import annotations

import torch

from rlkit.algo import ADV_ESTIMATORS, LOSS_AGG, POLICY_LOSSES, agg_loss, masked_mean, masked_sum
from rlkit.algo.advantages import AdvantageInputs, group_ids, group_stats, outcome_scores
from rlkit.algo.needs import needs, sequences

ESTIMATOR, LOSS, AGG = "test_plugin_centered", "test_plugin_ref_anchored", "test_plugin_seq_sum"
SENTINEL_CLIPFRAC = 0.125  # reported as actor/pg_clipfrac: proof that this loss ran in the actor worker
CALLS: list[int] = []  # rows per estimator call (the estimator runs on the driver)


@ADV_ESTIMATORS.register(ESTIMATOR)
@needs(groups=True)
@torch.no_grad()
def centered(inputs: AdvantageInputs):
    """Outcome minus the group mean, no std (Dr.GRPO's advantage, written as a user would)."""
    scores = outcome_scores(inputs.token_level_rewards, inputs.response_mask)
    _count, mean, _std = group_stats(scores, group_ids(inputs.index, scores.shape[0], ESTIMATOR))
    CALLS.append(int(scores.shape[0]))
    adv = (scores - mean).unsqueeze(-1) * inputs.response_mask
    return adv, adv


@POLICY_LOSSES.register(LOSS)
@needs(ref=True)
def ref_anchored(old_log_prob, log_prob, advantages, response_mask, *, ref_log_prob=None,
                 loss_agg_mode="token-mean", **_):
    """Policy gradient with a squared log-ratio anchor to the reference: it cannot run without ref_log_prob."""
    if ref_log_prob is None:
        raise RuntimeError(f"{LOSS}: no ref_log_prob although the loss declares @needs(ref=True)")
    ratio = torch.exp(torch.clamp(log_prob - old_log_prob, -20, 20))
    loss_mat = -advantages * ratio + 0.01 * (log_prob - ref_log_prob) ** 2
    zero = log_prob.new_zeros(())
    return {"pg_loss": agg_loss(loss_mat, response_mask, loss_agg_mode),
            "pg_clipfrac": zero + SENTINEL_CLIPFRAC,
            "ppo_kl": masked_mean(old_log_prob - log_prob, response_mask).detach(), "pg_clipfrac_lower": zero}


@LOSS_AGG.register(AGG)
@needs(unit=sequences)
def seq_sum(loss_mat, mask):
    """Mean over non-empty sequences of each sequence's summed loss (= seq-mean-token-sum, under a new name)."""
    per_seq = masked_sum(loss_mat, mask, dim=-1)
    return masked_mean(per_seq, (mask.sum(-1) > 0).to(per_seq.dtype))


def unregister() -> None:
    ADV_ESTIMATORS.unregister(ESTIMATOR)
    POLICY_LOSSES.unregister(LOSS)
    LOSS_AGG.unregister(AGG)
