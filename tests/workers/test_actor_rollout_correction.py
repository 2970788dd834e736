"""Rollout correction through the actor's real update (`ActorWorker.update_actor` on a 1-rank gloo group, tiny
Llama): sequence-level rejection reports what it masked, and a rejected row leaves the update untouched.

Six responses of 7, 1, 4, 0, 6 and 3 tokens (tests.perf.test_forward_equivalence.handmade_batch); the engine's
log-probs are the trainer's minus log(4)/n per token on rows 0 and 4, so their sequence ratio
pi_old / pi_rollout is 4, outside the bounds [0.5, 2]; every other row has ratio 1.
"""

from __future__ import annotations

import math

import pytest
import torch

from rlkit.algo.rollout_correction import RolloutCorrection
from rlkit.config.schema import ActorConfig, ModelConfig, OptimConfig
from rlkit.protocol import Batch
from rlkit.testing import save_tiny_model
from rlkit.workers.actor import ActorWorker
from tests.perf.test_forward_equivalence import PROMPT, handmade_batch

REJECTED = [0, 4]
SEQ_REJECTION = RolloutCorrection(rs_level="sequence", rs_lower=0.5, rs_upper=2.0)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("model") / "tiny", heads=2, tie_embeddings=True)


def make_actor(model_path, correction: RolloutCorrection | None) -> ActorWorker:
    cfg = ActorConfig(
        ppo_mini_batch_size=6,
        ppo_micro_batch_size_per_gpu=3,
        clip_ratio_low=0.2,
        clip_ratio_high=0.2,
        optim=OptimConfig(lr=1e-2, weight_decay=0.0),
    )
    actor = ActorWorker(
        cfg,
        ModelConfig(path=str(model_path)),
        total_steps=4,
        rollout_n=1,
        temperature=1.0,
        seed=0,
        rollout_correction=correction,
    )
    actor.init_model()
    return actor


def rollout_batch(actor: ActorWorker) -> Batch:
    batch = Batch(handmade_batch(0))
    batch["responses"] = batch["input_ids"][:, PROMPT:]
    batch.union(actor.compute_log_prob(batch).select(["old_log_probs"]))
    mask = batch["response_mask"].float()
    shift = torch.zeros(len(batch), 1)
    for row in REJECTED:
        shift[row] = math.log(4.0) / mask[row].sum()
    batch["rollout_log_probs"] = batch["old_log_probs"] - shift * mask
    return batch


def params(actor: ActorWorker) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in actor.model.full_state_dict().items()}


def test_sequence_rejection_reports_what_it_masked(process_group, model_path):
    actor = make_actor(model_path, SEQ_REJECTION)
    metrics = actor.update_actor(rollout_batch(actor)).meta["metrics"]
    # micro-batches of 3 rows: rows 0-2 (7+1+4 tokens, row 0 rejected), rows 3-5 (0+6+3, row 3 empty, row 4 rejected)
    assert metrics["rollout_corr/masked_seq_frac"] == pytest.approx([1 / 3, 1 / 2])
    assert metrics["rollout_corr/masked_token_frac"] == pytest.approx([7 / 12, 6 / 9])
    assert metrics["rollout_corr/token_ratio_max"] == pytest.approx([4 ** (1 / 7), 4 ** (1 / 6)], rel=1e-5)
    assert "actor/pg_loss" in metrics


def test_a_rejected_row_does_not_move_the_policy(process_group, model_path):
    """Same start, same batch, except the rejected rows' advantages: the same weights after the update; without the
    correction those rows do move it (so the comparison can fail)."""

    def updated(correction: RolloutCorrection | None, flip: bool) -> dict[str, torch.Tensor]:
        torch.manual_seed(0)
        actor = make_actor(model_path, correction)
        batch = rollout_batch(actor)
        if flip:
            adv = batch["advantages"].clone()
            adv[REJECTED] = -5.0 * adv[REJECTED] + 1.0 * batch["response_mask"][REJECTED]
            batch["advantages"] = adv
        actor.update_actor(batch)
        return params(actor)

    kept, changed = updated(SEQ_REJECTION, flip=False), updated(SEQ_REJECTION, flip=True)
    for name, value in kept.items():
        torch.testing.assert_close(changed[name], value, rtol=0, atol=0, msg=name)
    plain, flipped = updated(None, flip=False), updated(None, flip=True)
    assert any(not torch.equal(plain[k], flipped[k]) for k in plain)
