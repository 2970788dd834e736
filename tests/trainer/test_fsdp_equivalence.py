"""Two FSDP2 workers (gloo) compute the same update as one worker on the same global batch.

A fixed handmade rollout batch (prompts, responses of very different lengths, advantages, old and
reference log-probs) goes through `update_actor` on a 1-worker and on a 2-worker group; the
gradient norms and the resulting full weights must agree. The batch is built so that the two
ranks hold very different token counts (~88 vs ~24): a loss normalised per rank (token-mean over
each rank's own tokens, then FSDP's average over ranks) weighs each of rank 1's tokens ~2.3x and
each of rank 0's ~0.6x what the global token-mean gives them, and fails this test by far.

Tolerance: float32 on CPU; the two layouts sum the same numbers in a different order (micro-batches
of a rank, then a gloo all-reduce). Grad norms (the global norm before clipping, one per optimizer
step): 1e-5 relative (measured ~1e-7). Weights after 2-4 AdamW steps at lr 1e-3 (elements move up to
~4e-3): |w1 - w2| <= 1e-3 * |w1 - w0| over all weights (measured 1e-6 token-mean, 7e-5 seq-mean).
No per-element bound: Adam divides by sqrt(v), so float noise in a near-zero gradient entry becomes a
visible (but isolated) update difference, up to ~3e-5 here. Per-rank normalisation fails the grad-norm
check by ~35%.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlkit.protocol import Batch
from rlkit.testing import build_tiny_tokenizer
from rlkit.trainer.run.run_config import load_config
from rlkit.trainer.run.workers_setup import rl_workers
from tests.trainer.conftest import toy_overrides

PROMPTS, N, R = 8, 4, 6  # 8 prompts x 4 samples = 32 rows, responses up to 6 tokens
ROWS = PROMPTS * N


def handmade_batch(seed: int = 0) -> Batch:
    """Rows 0-15 (rank 0 of 2) have 5-6 response tokens, rows 16-31 (rank 1) only 1-2."""
    tok = build_tiny_tokenizer()
    g = torch.Generator().manual_seed(seed)
    texts = [f"copy the digits : {' '.join(str(d) for d in range(i % 4 + 1))}" for i in range(PROMPTS)]
    msgs = [tok.apply_chat_template([{"role": "user", "content": t}], tokenize=False, add_generation_prompt=True)
            for t in texts]
    enc = tok(msgs, padding="max_length", max_length=16, return_tensors="pt")
    prompt_ids = enc["input_ids"].repeat_interleave(N, 0)
    prompt_mask = enc["attention_mask"].repeat_interleave(N, 0)
    half = ROWS // 2
    lengths = torch.cat([torch.randint(5, R + 1, (half,), generator=g), torch.randint(1, 3, (half,), generator=g)])
    response_mask = (torch.arange(R)[None, :] < lengths[:, None]).long()
    digits = torch.tensor(tok.convert_tokens_to_ids([str(d) for d in range(10)]))
    responses = digits[torch.randint(0, 10, (ROWS, R), generator=g)]
    responses = torch.where(response_mask.bool(), responses, tok.pad_token_id)
    attention_mask = torch.cat([prompt_mask, response_mask], 1)
    position_ids = (attention_mask.cumsum(1) - 1).clamp(min=0)
    advantages = torch.randn(ROWS, 1, generator=g).expand(ROWS, R) * response_mask
    return Batch({
        "prompts": prompt_ids, "responses": responses, "response_mask": response_mask,
        "input_ids": torch.cat([prompt_ids, responses], 1), "attention_mask": attention_mask,
        "position_ids": position_ids, "advantages": advantages.float().contiguous(),
    })


def run_update(cfg_overrides: list[str], world_size: int, batch: Batch) -> tuple[dict, dict, Batch]:
    """Build a group of `world_size` workers, fill in old/ref log-probs if missing, run one `update_actor`."""
    cfg = load_config("grpo", cfg_overrides + [f"trainer.n_gpus_per_node={world_size}"])
    workers = rl_workers(cfg, cfg.actor_rollout_ref.model.path, total_steps=10)
    try:
        if "old_log_probs" not in batch:
            lp = workers.actor.compute_log_prob(batch)["old_log_probs"]
            noise = torch.randn(lp.shape, generator=torch.Generator().manual_seed(1))
            batch["old_log_probs"] = (lp + 0.1 * noise) * batch["response_mask"]  # ratios != 1: clipping matters
            batch["ref_log_prob"] = (lp - 0.2 * noise.abs()) * batch["response_mask"]
        out = workers.actor.update_actor(batch)
        state = workers.actor.full_state_dict()[0]
        return state, out.meta["metrics"], batch
    finally:
        workers.shutdown()


def same_minibatches_on_one_worker(batch: Batch, world_size: int, minis: int) -> Batch:
    """The row order under which 1 worker's mini-batches hold the same rows as `world_size` workers' do.

    DP_COMPUTE gives rank r the contiguous chunk r and each rank cuts its chunk into `minis`
    mini-batches, so global mini-batch m = piece m of every rank's chunk.
    """
    chunk = len(batch) // world_size
    piece = chunk // minis
    order = [r * chunk + m * piece + i for m in range(minis) for r in range(world_size) for i in range(piece)]
    return batch.index(torch.tensor(order))


@pytest.mark.slow
@pytest.mark.parametrize(
    "agg_mode, mini_prompts",
    [("token-mean", 4), ("seq-mean-token-mean", 8)],
    ids=["token-mean-2-minibatches", "seq-mean-token-mean-1-minibatch"],
)
def test_two_workers_match_one_worker(ray_local, toy_data, tiny_model, tmp_path, agg_mode, mini_prompts):
    overrides = toy_overrides(
        toy_data, tiny_model, tmp_path,
        data__train_batch_size=PROMPTS,
        actor_rollout_ref__rollout__n=N,
        actor_rollout_ref__actor__ppo_mini_batch_size=mini_prompts,
        actor_rollout_ref__actor__ppo_micro_batch_size_per_gpu=3,  # uneven micro-batches on purpose
        actor_rollout_ref__actor__ppo_epochs=2,
        actor_rollout_ref__actor__loss_agg_mode=agg_mode,
        actor_rollout_ref__actor__entropy_coeff=0.01,
        actor_rollout_ref__actor__use_kl_loss=True,
        actor_rollout_ref__actor__kl_loss_coef=0.1,
        actor_rollout_ref__actor__optim__lr=1e-3,
        actor_rollout_ref__actor__grad_clip=1e6,
    )
    minis = PROMPTS // mini_prompts
    state2, metrics2, batch = run_update(overrides, 2, handmade_batch())
    state1, metrics1, _ = run_update(overrides, 1, same_minibatches_on_one_worker(batch, 2, minis))
    norms1, norms2 = metrics1["actor/grad_norm"], metrics2["actor/grad_norm"]

    steps = 2 * minis  # ppo_epochs x mini-batches optimizer steps
    assert len(norms1) == steps and len(norms2) == 2 * steps  # rank 0's then rank 1's
    assert norms2[:steps] == pytest.approx(norms2[steps:], rel=1e-6)  # the norm is global: the ranks agree
    assert norms2[:steps] == pytest.approx(norms1, rel=1e-5)
    init = AutoModelForCausalLM.from_pretrained(tiny_model).state_dict()
    moved = torch.cat([(state1[k] - init[k]).flatten() for k in state1])
    gap = torch.cat([(state1[k] - state2[k]).flatten() for k in state1])
    rel, worst = float(gap.norm() / moved.norm()), float(gap.abs().max())
    print(f"{agg_mode}: |w1 - w0| {float(moved.norm()):.3e}, |w1 - w2| {float(gap.norm()):.3e}, max {worst:.2e}")
    assert float(moved.abs().max()) > 1e-3  # the update did something
    assert rel < 1e-3, f"1 vs 2 workers: |w1 - w2| / |w1 - w0| = {rel:.2e} (max element gap {worst:.2e})"


@pytest.mark.slow
def test_two_workers_match_one_worker_moe(ray_local, toy_data, tmp_path):
    """The same check for a tiny Qwen3-MoE: its fused expert tensors (E, 2I, H) shard along the experts under
    FSDP2; the router's load-balancing loss is logged (weight 0: a per-micro-batch mean is not additive, so
    different micro-batch cuts would differ by design) and the expert-load metrics come back."""
    from rlkit.testing import save_tiny_moe

    moe = save_tiny_moe(tmp_path / "moe", "qwen3_moe", sharpen=1.0, hidden=64, heads=1, experts=4, tie=True)
    overrides = toy_overrides(
        toy_data, moe, tmp_path,
        data__train_batch_size=PROMPTS,
        actor_rollout_ref__rollout__n=N,
        actor_rollout_ref__actor__ppo_mini_batch_size=4,
        actor_rollout_ref__actor__ppo_micro_batch_size_per_gpu=3,
        actor_rollout_ref__actor__optim__lr=1e-3,
        actor_rollout_ref__actor__grad_clip=1e6,
        actor_rollout_ref__actor__router_aux_loss_coef=0.0,
    )
    state2, metrics2, batch = run_update(overrides, 2, handmade_batch())
    state1, metrics1, _ = run_update(overrides, 1, same_minibatches_on_one_worker(batch, 2, 2))
    assert metrics2["actor/grad_norm"][:2] == pytest.approx(metrics1["actor/grad_norm"], rel=1e-5)
    for key in ("actor/router_aux_loss", "moe/expert_load_max_over_mean", "moe/dropped_or_unused_experts"):
        assert key in metrics1 and key in metrics2, key
    assert min(metrics1["actor/router_aux_loss"]) > 0
    init = AutoModelForCausalLM.from_pretrained(moe).state_dict()
    assert any(".experts.gate_up_proj" in k for k in state1)  # the in-memory (fused) layout was trained
    moved = torch.cat([(state1[k] - init[k]).flatten() for k in state1])
    gap = torch.cat([(state1[k] - state2[k]).flatten() for k in state1])
    assert float(moved.abs().max()) > 1e-3
    assert float(gap.norm() / moved.norm()) < 1e-3
