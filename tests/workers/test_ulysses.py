"""Ulysses sequence parallelism over 2 real gloo workers computes what the same 2 workers compute without it.

Two processes (FSDP2 over a 2-rank gloo group), each with its own micro-batch of a handmade rollout batch
(6 and 5 rows: left-padded prompts, right-padded responses of very different lengths, the union's token
count odd so the packed row is padded to the SP size). For each model (4 query heads with 4 key/value
heads: split over the group; with 1: repeated) and path (response-only logits, full logits, the fused
LM head, padded input, gradient checkpointing), the SP=2 model's log-probs, entropies, loss and
gradients (each rank's FSDP shard, after the reduce-scatter) equal the SP=1 model's (data parallel over
the same 2 ranks, which tests/trainer/test_fsdp_equivalence.py ties to 1 worker), and so do a critic's
values and the policy's sum_pi_squared (plain and fused head). Tolerance (float32): log-probs/entropies/values
1e-5 absolute (measured ~1e-6: the attention sums per head in another layout), loss 1e-6 relative, gradients
1e-4 of the global norm elementwise.
Config-time: an SP size that does not divide the workers, or the heads, is refused with the key's name.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from rlkit.algo.loss_agg import agg_loss
from rlkit.config.schema import FSDPConfig
from rlkit.errors import UserError
from tests.gloo_workers import gloo_rank, run_on_gloo_workers
from tests.workers.test_varlen_attention import handmade_batch

R = 7
VARIANTS = {
    "response-logits": dict(),
    "full-logits": dict(response_logits_only=False),
    "fused-head": dict(fused_lm_head=True),
    "padded-input": dict(remove_padding=False),
}


def rank_batch(rank: int) -> dict[str, torch.Tensor]:
    full = handmade_batch(rows=11, prompt=12, response=R, seed=5)
    if int(full["attention_mask"].sum()) % 2 == 0:  # an odd union: the packed row needs padding to 2
        full["attention_mask"][0, -1] = full["response_mask"][0, -1] = 0
        full["attention_mask"][0, -R:] = full["response_mask"][0]
    assert int(full["attention_mask"].sum()) % 2 == 1
    own = slice(0, 6) if rank == 0 else slice(6, 11)
    return {k: v[own] for k, v in full.items()}


def loss_step(model, batch: dict, response: int = R, **kw) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The update loop's micro-batch (`response` tokens per row): forward, this rank's loss weighted by
    `loss_scales`, backward (tests/workers/test_tensor_parallel.py uses it too)."""
    from rlkit.workers.micro_batch import loss_scales

    model.module.zero_grad(set_to_none=True)
    out = model.forward(
        batch["input_ids"], batch["attention_mask"], batch["position_ids"], response, temperature=0.7,
        with_entropy=True, **kw,
    )
    mask = batch["response_mask"].float()
    scale = loss_scales([batch["response_mask"]], "token-mean")[0]
    loss = scale * (agg_loss(-batch["advantages"] * out.log_probs, mask) - 0.01 * agg_loss(out.entropy, mask))
    loss.backward()
    return out.log_probs.detach(), out.entropy.detach(), loss.detach()


def step(model, batch: dict, **kw) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict]:
    """`loss_step`, with this rank's local gradients."""
    log_probs, entropy, loss = loss_step(model, batch, **kw)
    grads = {
        n: (p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad).detach().clone()
        for n, p in model.module.named_parameters()
    }
    return log_probs, entropy, loss, grads


def compare(a: tuple, b: tuple, valid: torch.Tensor, what: str) -> None:
    for x, y, name in zip(a[:2], b[:2], ("log-probs", "entropy")):
        assert torch.allclose(x[valid], y[valid], atol=1e-5, rtol=0), f"{what} {name}: {(x - y)[valid].abs().max()}"
    assert abs(float(a[2] - b[2])) <= 1e-6 * max(1.0, abs(float(a[2]))), f"{what} loss {a[2]} vs {b[2]}"
    sq = torch.tensor(sum(float((g**2).sum()) for g in a[3].values()))
    dist.all_reduce(sq)
    norm = float(sq.sqrt())
    assert norm > 0
    for name, g in a[3].items():
        diff = float((b[3][name] - g).abs().max()) if g.numel() else 0.0
        assert diff <= 1e-4 * norm, f"{what} {name}: |grad diff| {diff:.2e} vs norm {norm:.2e}"


def _sp_worker(rank: int, store_path: str, paths: dict[str, str], results) -> None:
    from rlkit.workers.fsdp_model import FSDPModel

    with gloo_rank(rank, store_path, results):
        batch = rank_batch(rank)
        valid = batch["response_mask"].bool()
        cpu = torch.device("cpu")
        for kind, path in paths.items():
            dp = FSDPModel(path, FSDPConfig(), cpu)
            sp = FSDPModel(path, FSDPConfig(), cpu, ulysses_sequence_parallel_size=2)
            assert sp.sp is not None and sp.sp.size == 2 and dp.sp is None
            for name, variant in VARIANTS.items():
                compare(step(dp, batch, **variant), step(sp, batch, **variant), valid, f"{kind}/{name}")
            ckpt = FSDPModel(path, FSDPConfig(), cpu, gradient_checkpointing=True, ulysses_sequence_parallel_size=2)
            ckpt.module.train()
            compare(step(dp, batch), step(ckpt, batch), valid, f"{kind}/checkpointing")
            args = [batch[k] for k in ("input_ids", "attention_mask", "position_ids")]
            critics = []
            for size in (1, 2):
                torch.manual_seed(0)  # the value head is new: the same init for both
                critics.append(FSDPModel(path, FSDPConfig(), cpu, value_head=True, ulysses_sequence_parallel_size=size))
            with torch.no_grad():
                v1, v2 = (c.forward(*args, R).values for c in critics)
            assert torch.allclose(v1[valid], v2[valid], atol=1e-5, rtol=0), f"{kind} values"
            with torch.no_grad():  # sum_pi_squared (the OTB estimators'): gathered over the group as the log-probs
                for fused in (False, True):
                    a, b = (m.forward(*args, R, temperature=0.7, fused_lm_head=fused,
                                      with_sum_pi_squared=True).sum_pi_squared for m in (dp, sp))
                    assert torch.allclose(a[valid], b[valid], atol=1e-5, rtol=0), f"{kind} sum_pi_squared {fused=}"


@pytest.fixture(scope="module")
def model_paths(tmp_path_factory):
    from transformers import AutoConfig, AutoModelForCausalLM

    from rlkit.testing import save_tiny_model

    root = tmp_path_factory.mktemp("sp-models")
    paths = {}
    for kind, kv in (("kv4-split", 4), ("kv1-repeated", 1)):
        path = save_tiny_model(root / kind, heads=4, tie_embeddings=True)
        config = AutoConfig.from_pretrained(path)
        config.num_key_value_heads = kv
        torch.manual_seed(kv)
        AutoModelForCausalLM.from_config(config).save_pretrained(path)
        paths[kind] = str(path)
    return paths


@pytest.mark.slow
def test_sp2_matches_sp1_on_two_gloo_workers(model_paths, tmp_path):
    run_on_gloo_workers(_sp_worker, model_paths, tmp_path)


def test_config_refuses_sp_that_does_not_divide_the_workers(toy_data, tmp_path):
    from rlkit.trainer.run.run_config import load_config
    from tests.trainer.conftest import toy_overrides

    base = toy_overrides(toy_data, str(tmp_path / "unused-model"), tmp_path, trainer__n_gpus_per_node=2)
    assert load_config("grpo", [*base, "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"])
    for key in ("actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic"):
        with pytest.raises(UserError, match=f"{key}.ulysses_sequence_parallel_size=3 must be >= 1 and divide the 2"):
            load_config("grpo", [*base, f"{key}.ulysses_sequence_parallel_size=3"])


def test_heads_must_split_over_the_group():
    from rlkit.workers.ulysses import check_heads

    check_heads(4, 1, 2, "")  # key/value heads repeated
    with pytest.raises(
        ValueError, match="ulysses_sequence_parallel_size=3 must divide the model's num_attention_heads=4"
    ):
        check_heads(4, 4, 3, "")
