"""The fused chunked LM head computes what the naive head computes, and keeps no (T x V) tensor for backward.

The function alone (float32): log-probs, entropies and the gradients wrt hidden states, head weight and
bias equal the naive `logits -> logprobs_from_logits / entropy_from_logits` path within 1e-5, with and
without entropy, at temperature 1 and 0.7, with tied embeddings. The bytes autograd saves for backward
are measured with `saved_tensors_hooks`. Inside `FSDPModel.forward` (FSDP2 on gloo, 1 and 2 ranks, tied
embeddings, padded and packed, LoRA) the fused path gives the plain path's outputs and gradients; an
actor update with `fused_lm_head=true` gives the same grad norms and weights as with it off.
"""

from __future__ import annotations

import logging

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlkit.algo.loss_agg import agg_loss
from rlkit.algo.utils import entropy_from_logits, logprobs_from_logits
from rlkit.config.schema import FSDPConfig, ModelConfig
from rlkit.testing import save_tiny_model
from rlkit.workers.fsdp_model import FSDPModel
from rlkit.workers.fused_lm_head import fused_lm_head_logprob, unfusable_reason
from tests.gloo_workers import gloo_rank, run_on_gloo_workers
from tests.perf.test_forward_equivalence import RESPONSE, handmade_batch

T, H, V = 37, 16, 50  # 37 rows in chunks of 8: a short last chunk


def naive(hidden, weight, bias, labels, temperature, with_entropy):
    logits = torch.nn.functional.linear(hidden, weight, bias) / temperature
    return logprobs_from_logits(logits, labels), (entropy_from_logits(logits) if with_entropy else None)


def grads_of(fn, leaves, labels, temperature, with_entropy, bias=None, hidden_fn=None):
    """Outputs and leaf gradients of a weighted sum of log-probs (and entropies): every row's grad differs."""
    g = torch.Generator().manual_seed(3)
    a, c = torch.randn(T, generator=g), torch.randn(T, generator=g)
    for x in leaves:
        x.grad = None
    hidden, weight = hidden_fn() if hidden_fn else (leaves[0], leaves[1])
    lp, ent = fn(hidden, weight, bias, labels, temperature, with_entropy)
    loss = (a * lp).sum() + ((c * ent).sum() if with_entropy else 0.0)
    loss.backward()
    return lp.detach(), (ent.detach() if ent is not None else None), [x.grad.clone() for x in leaves]


def fused(hidden, weight, bias, labels, temperature, with_entropy):
    return fused_lm_head_logprob(hidden, weight, bias, labels, temperature, chunk_size=8, with_entropy=with_entropy)[:2]


def assert_same(got, want):
    lp, ent, grads = got
    lp_ref, ent_ref, grads_ref = want
    torch.testing.assert_close(lp, lp_ref, atol=1e-5, rtol=1e-5)
    if ent_ref is not None:
        torch.testing.assert_close(ent, ent_ref, atol=1e-5, rtol=1e-5)
    for g, g_ref in zip(grads, grads_ref, strict=True):
        assert g_ref.abs().max() > 0
        torch.testing.assert_close(g, g_ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("with_bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("with_entropy", [False, True], ids=["logp", "logp+entropy"])
def test_values_and_gradients_match_the_naive_head(with_bias, temperature, with_entropy):
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(T, H, generator=g).requires_grad_()
    weight = (0.3 * torch.randn(V, H, generator=g)).requires_grad_()
    bias = torch.randn(V, generator=g).requires_grad_() if with_bias else None
    labels = torch.randint(0, V, (T,), generator=g)
    leaves = [hidden, weight] + ([bias] if with_bias else [])
    want = grads_of(naive, leaves, labels, temperature, with_entropy, bias)
    got = grads_of(fused, leaves, labels, temperature, with_entropy, bias)
    assert_same(got, want)


def test_entropy_alone_has_gradients():
    """The entropy bonus without a log-prob term (grad of log-probs is None in backward)."""
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(T, H, generator=g).requires_grad_()
    weight = (0.3 * torch.randn(V, H, generator=g)).requires_grad_()
    labels = torch.randint(0, V, (T,), generator=g)
    naive(hidden, weight, None, labels, 0.7, True)[1].sum().backward()
    want = [hidden.grad.clone(), weight.grad.clone()]
    hidden.grad = weight.grad = None
    fused(hidden, weight, None, labels, 0.7, True)[1].sum().backward()
    for got, ref in zip([hidden.grad, weight.grad], want, strict=True):
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


def test_bfloat16_inputs_give_float32_outputs_and_bf16_grads():
    """Mixed precision (FSDP2's bf16 compute on GPU): logits upcast per chunk, grads in the inputs' dtype,
    close to the float32 result (bf16 has ~3 significant digits)."""
    g = torch.Generator().manual_seed(4)
    hidden32 = torch.randn(T, H, generator=g)
    weight32 = 0.3 * torch.randn(V, H, generator=g)
    labels = torch.randint(0, V, (T,), generator=g)
    hidden, weight = hidden32.bfloat16().requires_grad_(), weight32.bfloat16().requires_grad_()
    lp, ent = fused(hidden, weight, None, labels, 1.0, True)
    assert lp.dtype == ent.dtype == torch.float32
    (lp.sum() + ent.sum()).backward()
    assert hidden.grad.dtype == weight.grad.dtype == torch.bfloat16
    ref = [hidden32.clone().requires_grad_(), weight32.clone().requires_grad_()]
    lp_ref, ent_ref = naive(ref[0], ref[1], None, labels, 1.0, True)
    (lp_ref.sum() + ent_ref.sum()).backward()
    torch.testing.assert_close(lp, lp_ref.detach(), atol=0.05, rtol=0.02)
    torch.testing.assert_close(hidden.grad.float(), ref[0].grad, atol=0.05, rtol=0.05)
    torch.testing.assert_close(weight.grad.float(), ref[1].grad, atol=0.05, rtol=0.05)


def test_tied_embeddings_get_both_gradients():
    """The head weight is the input embedding: its gradient is the head's plus the embedding lookup's."""
    g = torch.Generator().manual_seed(2)
    emb = torch.nn.Embedding(V, H)
    with torch.no_grad():
        emb.weight.copy_(0.3 * torch.randn(V, H, generator=g))
    proj = torch.nn.Linear(H, H)
    ids = torch.randint(0, V, (T,), generator=g)
    labels = torch.randint(0, V, (T,), generator=g)
    leaves = [emb.weight, proj.weight]

    def tied():
        return torch.tanh(proj(emb(ids))), emb.weight

    for with_entropy in (False, True):
        want = grads_of(naive, leaves, labels, 0.7, with_entropy, hidden_fn=tied)
        got = grads_of(fused, leaves, labels, 0.7, with_entropy, hidden_fn=tied)
        assert_same(got, want)


def saved_bytes(fn, hidden, weight, labels, with_entropy) -> int:
    """Bytes of the distinct storages autograd keeps for backward while `fn` runs."""
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        storages[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        lp, ent = fn(hidden, weight, None, labels, 1.0, with_entropy)
        (lp.sum() + (ent.sum() if with_entropy else 0.0)).backward()
    return sum(storages.values())


@pytest.mark.parametrize("with_entropy", [False, True], ids=["logp", "logp+entropy"])
def test_backward_keeps_no_token_by_vocab_tensor(with_entropy):
    rows, hid, vocab = 512, 32, 4096
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(rows, hid, generator=g).requires_grad_()
    weight = (0.1 * torch.randn(vocab, hid, generator=g)).requires_grad_()
    labels = torch.randint(0, vocab, (rows,), generator=g)
    fused_bytes = saved_bytes(fused, hidden, weight, labels, with_entropy)
    naive_bytes = saved_bytes(naive, hidden, weight, labels, with_entropy)
    linear_bound = 4 * (rows * hid + vocab * hid + 4 * rows)  # hidden, weight, labels and 2 floats per row
    assert fused_bytes <= linear_bound, (fused_bytes, linear_bound)
    assert naive_bytes >= 4 * rows * vocab  # what the fused path avoids
    print(f"saved for backward: fused {fused_bytes / 2**20:.2f} MiB, naive {naive_bytes / 2**20:.2f} MiB")


# ------------------------------------------------------------------- FSDPModel.forward


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("model") / "tiny", heads=2, tie_embeddings=True)


def forward_backward(model: FSDPModel, batch: dict, *, fused_lm_head: bool, remove_padding: bool):
    """Forward (temperature 0.7, entropy) + a policy-gradient loss with an entropy bonus + backward."""
    model.module.zero_grad(set_to_none=True)
    out = model.forward(
        batch["input_ids"],
        batch["attention_mask"],
        batch["position_ids"],
        RESPONSE,
        temperature=0.7,
        with_entropy=True,
        remove_padding=remove_padding,
        chunk_size=5,
        fused_lm_head=fused_lm_head,
    )
    mask = batch["response_mask"].float()
    loss = agg_loss(-batch["advantages"] * out.log_probs, mask) - 0.01 * agg_loss(out.entropy, mask)
    loss.backward()
    grads = {}
    for n, p in model.module.named_parameters():
        if p.grad is not None:
            g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
            grads[n] = g.detach().clone()
    return out.log_probs.detach(), out.entropy.detach(), grads


def compare_fused_to_plain(model: FSDPModel, batch: dict, remove_padding: bool) -> None:
    widths: list[int] = []  # last dim of what the head returns: the vocab (plain), 1 (fused: no logits)
    head = model.module.get_output_embeddings()
    handle = head.register_forward_hook(lambda m, i, out: widths.append(out.shape[-1]))
    try:
        lp_ref, ent_ref, g_ref = forward_backward(model, batch, fused_lm_head=False, remove_padding=remove_padding)
        lp, ent, g = forward_backward(model, batch, fused_lm_head=True, remove_padding=remove_padding)
    finally:
        handle.remove()
    assert widths == [model.config.vocab_size, 1]
    valid = batch["response_mask"].bool()
    torch.testing.assert_close(lp[valid], lp_ref[valid], atol=1e-5, rtol=0)
    torch.testing.assert_close(ent[valid], ent_ref[valid], atol=1e-5, rtol=0)
    assert set(g) == set(g_ref) and g_ref
    for name, ref in g_ref.items():
        torch.testing.assert_close(g[name], ref, atol=1e-5, rtol=1e-4, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("remove_padding", [False, True], ids=["padded", "packed"])
def test_fsdp_forward_fused_matches_plain(process_group, model_path, remove_padding):
    model = FSDPModel(str(model_path), FSDPConfig(shard_single_worker=True), torch.device("cpu"))
    head = model.module.get_output_embeddings()
    assert head.weight is model.module.get_input_embeddings().weight  # tied: one (sharded) parameter
    compare_fused_to_plain(model, handmade_batch(), remove_padding)
    assert "forward" not in vars(head)  # the head is itself again
    with torch.no_grad():  # scoring (old / ref log-probs): no graph at all
        out = model.forward(
            *(handmade_batch()[k] for k in ("input_ids", "attention_mask", "position_ids")),
            RESPONSE,
            fused_lm_head=True,
            remove_padding=remove_padding,
        )
    assert out.log_probs.grad_fn is None


def test_fsdp_forward_fused_matches_plain_moe_untied(process_group, tmp_path):
    """A tiny Qwen3-MoE with its own (untied) LM head: the head's weight gets its gradient alone."""
    from rlkit.testing import save_tiny_moe

    path = save_tiny_moe(tmp_path / "moe", "qwen3_moe", sharpen=1.0, hidden=64, heads=1, experts=4, tie=False)
    model = FSDPModel(str(path), FSDPConfig(shard_single_worker=True), torch.device("cpu"))
    assert model.module.get_output_embeddings().weight is not model.module.get_input_embeddings().weight
    for remove_padding in (False, True):
        compare_fused_to_plain(model, handmade_batch(), remove_padding)


def _two_rank_worker(rank: int, store_path: str, model_path: str, results) -> None:
    with gloo_rank(rank, store_path, results):
        model = FSDPModel(model_path, FSDPConfig(), torch.device("cpu"))
        batch = {k: v[rank * 3 : rank * 3 + 3] for k, v in handmade_batch().items()}  # each rank its 3 rows
        for remove_padding in (False, True):
            compare_fused_to_plain(model, batch, remove_padding)


@pytest.mark.slow
def test_two_gloo_ranks_fused_matches_plain(model_path, tmp_path):
    """FSDP2 over 2 ranks shards the (tied) head weight; the fused head runs inside the root's forward, where it
    is gathered, and its gradient is reduce-scattered as the plain path's is."""
    run_on_gloo_workers(_two_rank_worker, str(model_path), tmp_path, timeout_s=240)


def test_lora_model_uses_the_fused_head(process_group, model_path):
    """peft injects the adapter in place and leaves the LM head alone: the fused path applies and matches."""
    model = FSDPModel(str(model_path), FSDPConfig(), torch.device("cpu"), lora=ModelConfig(lora_rank=4, lora_alpha=8))
    assert unfusable_reason(model.module) is None
    with torch.no_grad():  # a nonzero adapter, so its gradients are not trivially the same
        for name, p in model.module.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    compare_fused_to_plain(model, handmade_batch(), remove_padding=False)


def test_adapted_lm_head_falls_back_with_a_logged_reason(process_group, model_path, caplog):
    lora = ModelConfig(lora_rank=4, lora_alpha=8, target_modules=["q_proj", "lm_head"])
    model = FSDPModel(str(model_path), FSDPConfig(), torch.device("cpu"), lora=lora)
    assert "not a plain nn.Linear" in unfusable_reason(model.module)
    batch = handmade_batch()
    args = [batch[k] for k in ("input_ids", "attention_mask", "position_ids")]
    with caplog.at_level(logging.WARNING, logger="rlkit.workers.fsdp_model"), torch.no_grad():
        fused_out = model.forward(*args, RESPONSE, with_entropy=True, fused_lm_head=True)
        plain_out = model.forward(*args, RESPONSE, with_entropy=True)
    assert "fused_lm_head: using the plain LM head path" in caplog.text
    assert torch.equal(fused_out.log_probs, plain_out.log_probs)


def test_logit_transforming_models_are_not_fused(model_path):
    model = AutoModelForCausalLM.from_pretrained(model_path)
    assert unfusable_reason(model) is None
    model.config.final_logit_softcapping = 30.0
    assert "final_logit_softcapping" in unfusable_reason(model)


# ------------------------------------------------------------------- actor update


@pytest.mark.slow
def test_actor_update_with_fused_head_matches_plain(ray_local, toy_data, model_path, tmp_path):
    """One worker, 2 mini-batches x 2 epochs with an entropy bonus and a KL loss: same grad norms, same weights."""
    from tests.trainer.test_fsdp_equivalence import handmade_batch as rollout_batch
    from tests.trainer.test_fsdp_equivalence import run_update, toy_overrides

    def overrides(fused: bool) -> list[str]:
        return toy_overrides(
            toy_data,
            model_path,
            tmp_path,
            data__train_batch_size=8,
            actor_rollout_ref__rollout__n=4,
            actor_rollout_ref__actor__ppo_mini_batch_size=4,
            actor_rollout_ref__actor__ppo_micro_batch_size_per_gpu=3,
            actor_rollout_ref__actor__ppo_epochs=2,
            actor_rollout_ref__actor__entropy_coeff=0.01,
            actor_rollout_ref__actor__use_kl_loss=True,
            actor_rollout_ref__actor__optim__lr=1e-3,
            actor_rollout_ref__actor__grad_clip=1e6,
            actor_rollout_ref__actor__logits_chunk_size=7,
            actor_rollout_ref__model__fused_lm_head=fused,
        )

    state_off, metrics_off, batch = run_update(overrides(False), 1, rollout_batch())
    state_on, metrics_on, _ = run_update(overrides(True), 1, batch)
    assert len(metrics_on["actor/grad_norm"]) == 4
    assert metrics_on["actor/grad_norm"] == pytest.approx(metrics_off["actor/grad_norm"], rel=1e-5)
    assert metrics_on["actor/entropy_loss"] == pytest.approx(metrics_off["actor/entropy_loss"], rel=1e-5)
    init = AutoModelForCausalLM.from_pretrained(model_path).state_dict()
    moved = torch.cat([(state_off[k] - init[k]).flatten() for k in state_off])
    gap = torch.cat([(state_off[k] - state_on[k]).flatten() for k in state_off])
    assert float(moved.abs().max()) > 1e-3  # the update did something
    assert float(gap.norm() / moved.norm()) < 1e-4


def test_bench_writes_its_table(tmp_path):
    """`bench/lm_head.py` at toy sizes: a row per (variant, T), the fused one saving less for backward."""
    import json
    import subprocess
    import sys

    from tests.trainer.conftest import REPO

    out = tmp_path / "lm_head.json"
    cmd = [
        sys.executable,
        "bench/lm_head.py",
        "--tokens",
        "256",
        "--hidden",
        "16",
        "--vocab",
        "2048",
        "--chunk",
        "64",
        "--threads",
        "1",
        "--out",
        str(out),
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "mem ratio" in res.stdout
    naive, fused = json.loads(out.read_text())["rows"]
    assert (naive["variant"], fused["variant"]) == ("naive", "fused")
    assert fused["saved_for_backward_mb"] * 10 < naive["saved_for_backward_mb"]


def test_config_rejects_fused_head_without_response_logits_only(toy_data, model_path, tmp_path):
    from rlkit.errors import UserError
    from rlkit.trainer.run.run_config import load_config
    from tests.trainer.conftest import toy_overrides

    base = toy_overrides(toy_data, model_path, tmp_path, actor_rollout_ref__model__fused_lm_head=True)
    assert load_config("grpo", base).actor_rollout_ref.model.fused_lm_head is True
    with pytest.raises(UserError, match="fused_lm_head=true needs actor_rollout_ref.model.response_logits_only"):
        load_config("grpo", [*base, "actor_rollout_ref.model.response_logits_only=false"])


@pytest.mark.parametrize("fused", [False, True], ids=["plain", "fused"])
@pytest.mark.parametrize("remove_padding", [False, True], ids=["padded", "packed"])
def test_loss_mask_scores_only_its_positions(process_group, model_path, remove_padding, fused):
    """SFT's `loss_mask`: the masked positions' log-probs, entropy and the loss's gradients equal the unmasked
    forward's, the others are 0, and on the packed row the LM head runs on the masked rows alone."""
    model = FSDPModel(str(model_path), FSDPConfig(shard_single_worker=True), torch.device("cpu"))
    batch = handmade_batch()
    keep = batch["response_mask"].bool() & (torch.arange(RESPONSE) % 2 == 0)  # every other response token
    rows: list[int] = []
    head = model.module.get_output_embeddings()
    handle = head.register_forward_hook(lambda m, i, out: rows.append(i[0].shape[-2]))

    def scored(loss_mask):
        model.module.zero_grad(set_to_none=True)
        out = model.forward(*(batch[k] for k in ("input_ids", "attention_mask", "position_ids")), RESPONSE,
                            with_entropy=True, remove_padding=remove_padding, chunk_size=5, fused_lm_head=fused,
                            loss_mask=loss_mask)
        (-(out.log_probs * keep).sum() + 0.1 * (out.entropy * keep).sum()).backward()
        grads = {n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).clone()
                 for n, p in model.module.named_parameters() if p.grad is not None}
        return out.log_probs.detach(), out.entropy.detach(), grads

    try:
        lp_all, ent_all, g_all = scored(None)
        lp, ent, g = scored(keep)
    finally:
        handle.remove()
    torch.testing.assert_close(lp[keep], lp_all[keep], atol=1e-6, rtol=0)
    torch.testing.assert_close(ent[keep], ent_all[keep], atol=1e-6, rtol=0)
    assert not lp[~keep].any() and not ent[~keep].any()
    assert set(g) == set(g_all) and g_all
    for name, ref in g_all.items():
        torch.testing.assert_close(g[name], ref, atol=1e-6, rtol=1e-5, msg=lambda m, n=name: f"{n}: {m}")
    if remove_padding:
        assert rows == [int(batch["response_mask"].sum()), int(keep.sum())]
