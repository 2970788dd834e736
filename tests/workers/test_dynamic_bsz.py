"""Dynamic batch size (micro-batches by a token budget) computes what fixed micro-batches compute, in fewer calls.

The real roles on a 1-rank gloo group (tiny Llama, float32): the actor's update, its old-log-prob pass, the
reference's log-prob pass and the critic's value forward and update, each once with 2 rows per forward and
once with a budget of 40 tokens (2 x the longest row, 19 tokens). 12 rows of 4-19 tokens (124 in all):
6 forwards of 2 rows against ceil(124 / 40) = 4 by tokens.

Equal means: log-probs, entropies and values at response tokens within 1e-5 absolute (packing makes a
row's attention independent of its neighbours; measured 5e-7 and 6e-8); the mini-batch loss (the micro-batch
losses weighted by `loss_scales`, e.g. a token-mean over all 12 rows) and the gradient the optimizer step used
within 1e-5 relative (measured 1-2e-7): the loss normalisation does not depend on how rows are grouped. (The
critic's equality also needs its value head without transformers' default dropout, which drew its masks
over the micro-batches' tokens in their order.)
"""

from __future__ import annotations

import pytest
import torch

from rlkit.config.schema import ActorConfig, CriticConfig, CriticModelConfig, ModelConfig, OptimConfig, RefConfig
from rlkit.protocol import Batch
from rlkit.testing import save_tiny_model
from rlkit.workers.actor import ActorWorker, RefWorker
from rlkit.workers.critic import CriticWorker
from rlkit.workers.micro_batch import MicroBatching, loss_scales
from tests.perf.test_forward_equivalence import PROMPT, handmade_batch

ROWS, BUDGET = 2, 40
FIXED, DYNAMIC = MicroBatching(ROWS), MicroBatching(ROWS, use_dynamic_bsz=True, max_token_len=BUDGET)
CALLS = {FIXED: 6, DYNAMIC: 4}


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("model") / "tiny", heads=2, tie_embeddings=True)


def mixed_batch() -> Batch:
    """12 rows: two handmade batches (prompts of 3-12 tokens, responses of 0-7), advantages and returns set."""
    parts = [handmade_batch(seed) for seed in (0, 1)]
    batch = Batch({k: torch.cat([p[k] for p in parts]) for k in parts[0]})
    batch["responses"] = batch["input_ids"][:, PROMPT:]
    batch["returns"] = batch["advantages"] * 0.5
    return batch


def count_forwards(worker) -> list[int]:
    """Counts the worker's model forwards (one per micro-batch)."""
    calls = [0]
    forward = worker.model.forward

    def counted(*args, **kwargs):
        calls[0] += 1
        return forward(*args, **kwargs)

    worker.model.forward = counted
    return calls


def response_close(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> None:
    torch.testing.assert_close(a * mask, b * mask, rtol=0, atol=1e-5)


def step_gradient(worker) -> torch.Tensor:
    """The gradient of the optimizer's one step: AdamW's first moment is (1 - beta1) x it."""
    return torch.cat([s["exp_avg"].flatten() for s in worker.model.optimizer.state.values()])


def make_actor(model_path, micro: MicroBatching, loss_agg_mode: str = "token-mean") -> ActorWorker:
    cfg = ActorConfig(
        ppo_mini_batch_size=12, ppo_micro_batch_size_per_gpu=micro.rows, use_dynamic_bsz=micro.use_dynamic_bsz,
        ppo_max_token_len_per_gpu=micro.max_token_len or 16384, clip_ratio_low=0.2, clip_ratio_high=0.2,
        entropy_coeff=0.01, loss_agg_mode=loss_agg_mode, optim=OptimConfig(lr=1e-2, weight_decay=0.0),
    )
    actor = ActorWorker(cfg, ModelConfig(path=str(model_path)), total_steps=2, rollout_n=1, temperature=0.7,
                        seed=0, log_prob=micro)
    actor.init_model()
    return actor


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum"])
def test_actor_update_by_tokens_equals_fixed_micro_batches(process_group, model_path, mode):
    """On-policy (no old_log_probs: the update's forward supplies them), with an entropy term."""
    batch = mixed_batch()
    results = {}
    for micro in (FIXED, DYNAMIC):
        actor = make_actor(model_path, micro, mode)
        calls, losses = count_forwards(actor), []
        policy_loss = actor._policy_loss

        def recording(response_length, policy_loss=policy_loss, losses=losses):
            fn = policy_loss(response_length)

            def loss_fn(mb):
                loss, metrics = fn(mb)
                losses.append((float(loss.detach()), mb["response_mask"]))
                return loss, metrics

            return loss_fn

        actor._policy_loss = recording
        metrics = actor.update_actor(batch).meta["metrics"]
        weights = loss_scales([m for _, m in losses], mode)
        mini_batch_loss = sum(loss * w for (loss, _), w in zip(losses, weights))
        results[micro] = (calls[0], mini_batch_loss, metrics["actor/grad_norm"][0], step_gradient(actor))
    (fixed_calls, fixed_loss, fixed_norm, fixed_grad), (dyn_calls, dyn_loss, dyn_norm, dyn_grad) = results.values()
    assert (fixed_calls, dyn_calls) == (CALLS[FIXED], CALLS[DYNAMIC])
    assert dyn_loss == pytest.approx(fixed_loss, rel=1e-5)
    assert dyn_norm == pytest.approx(fixed_norm, rel=1e-5)
    gap = float((dyn_grad - fixed_grad).norm() / fixed_grad.norm())
    print(f"{mode}: loss gap {abs(dyn_loss / fixed_loss - 1):.1e}, gradient gap {gap:.1e}")
    assert fixed_grad.norm() > 0 and gap < 1e-5, f"fixed vs dynamic micro-batches: gradients differ by {gap:.2e}"


def test_log_prob_passes_by_tokens_equal_fixed_micro_batches(process_group, model_path):
    """The actor's old-log-probs (and entropies) and the reference's log-probs: same values, back in row order."""
    batch = mixed_batch()
    mask = batch["response_mask"].float()
    out = {}
    for micro in (FIXED, DYNAMIC):
        actor = make_actor(model_path, micro)
        calls = count_forwards(actor)
        old = actor.compute_log_prob(batch)
        ref = RefWorker(RefConfig(log_prob_micro_batch_size_per_gpu=micro.rows,
                                  log_prob_use_dynamic_bsz=micro.use_dynamic_bsz,
                                  log_prob_max_token_len_per_gpu=micro.max_token_len),
                        ModelConfig(path=str(model_path)), temperature=0.7, logits_chunk_size=1024)
        ref.init_model()
        ref_calls = count_forwards(ref)
        out[micro] = (old, ref.compute_ref_log_prob(batch))
        assert calls[0] == ref_calls[0] == CALLS[micro]
    (fixed_old, fixed_ref), (dyn_old, dyn_ref) = out[FIXED], out[DYNAMIC]
    for key in ("old_log_probs", "entropys"):
        response_close(dyn_old[key], fixed_old[key], mask)
    response_close(dyn_ref["ref_log_prob"], fixed_ref["ref_log_prob"], mask)
    print(f"log-prob gap {float(((dyn_old['old_log_probs'] - fixed_old['old_log_probs']) * mask).abs().max()):.1e}")
    response_close(fixed_ref["ref_log_prob"], fixed_old["old_log_probs"], mask)  # same weights, same temperature
    assert (fixed_old["old_log_probs"] * mask).abs().sum() > 0


def test_critic_values_and_update_by_tokens_equal_fixed_micro_batches(process_group, model_path):
    batch = mixed_batch()
    mask = batch["response_mask"].float()
    out = {}
    for micro in (FIXED, DYNAMIC):
        cfg = CriticConfig(model=CriticModelConfig(path=str(model_path)), optim=OptimConfig(lr=1e-2, weight_decay=0),
                           ppo_mini_batch_size=12, ppo_epochs=1, use_dynamic_bsz=micro.use_dynamic_bsz,
                           ppo_micro_batch_size_per_gpu=micro.rows, ppo_max_token_len_per_gpu=BUDGET,
                           forward_micro_batch_size_per_gpu=micro.rows, forward_max_token_len_per_gpu=BUDGET)
        critic = CriticWorker(cfg, total_steps=2, rollout_n=1)
        torch.manual_seed(0)  # the value head's init
        critic.init_model()
        calls = count_forwards(critic)
        values = critic.compute_values(batch)["values"]
        assert calls[0] == CALLS[micro]
        batch["values"] = values
        metrics = critic.update_critic(batch).meta["metrics"]
        assert calls[0] == 2 * CALLS[micro]  # the update's micro-batches, as many
        out[micro] = (values, metrics["critic/grad_norm"][0], step_gradient(critic))
    (fixed_values, fixed_norm, fixed_grad), (dyn_values, dyn_norm, dyn_grad) = out[FIXED], out[DYNAMIC]
    response_close(dyn_values, fixed_values, mask)
    assert dyn_norm == pytest.approx(fixed_norm, rel=1e-5)
    gap = float((dyn_grad - fixed_grad).norm() / fixed_grad.norm())
    print(f"critic: value gap {float(((dyn_values - fixed_values) * mask).abs().max()):.1e}, gradient gap {gap:.1e}")
    assert fixed_grad.norm() > 0 and gap < 1e-5, f"fixed vs dynamic micro-batches: gradients differ by {gap:.2e}"
