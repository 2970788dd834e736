"""The fast forward paths compute what the plain one computes: same log-probs, entropies, loss and gradients.

`FSDPModel.forward` (FSDP2 on a 1-rank gloo group, as a worker runs it) on a handmade batch of
left-padded prompts and right-padded responses of very different lengths, with every combination
of remove-padding (packing with a block-diagonal mask), response-only logits (the LM head only
where a response token is predicted) and vocabulary chunking of log-prob/entropy, against the
plain path (padded batch, full logits, one chunk).

Tolerance (float32 on CPU): log-probs and entropies at valid response tokens within 1e-5 absolute
(measured 5e-7 with packing, where the attention sums over a different length; 0 for chunking and
response-only logits, which compute the same rows); the scalar loss within 1e-6 relative (measured
0); every parameter's gradient within 1e-4 of the global gradient norm, elementwise (measured 1e-8).
Positions outside `response_mask` are not compared: they carry no loss and the fast path leaves them 0.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from rlkit.algo.loss_agg import agg_loss
from rlkit.config.schema import FSDPConfig
from rlkit.testing import build_tiny_tokenizer, save_tiny_model
from rlkit.workers.fsdp_model import FSDPModel

PROMPT, RESPONSE = 12, 7


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("model") / "tiny", heads=2, tie_embeddings=True)


def handmade_batch(seed: int = 0) -> dict[str, torch.Tensor]:
    """6 rows: prompts of 3-12 tokens (left-padded), responses of 0-7 tokens (right-padded)."""
    tok = build_tiny_tokenizer()
    g = torch.Generator().manual_seed(seed)
    rows = 6
    prompt_len = torch.tensor([12, 3, 7, 5, 10, 4])
    resp_len = torch.tensor([7, 1, 4, 0, 6, 3])
    vocab = len(tok)
    prompt_mask = (torch.arange(PROMPT)[None, :] >= (PROMPT - prompt_len)[:, None]).long()
    response_mask = (torch.arange(RESPONSE)[None, :] < resp_len[:, None]).long()
    ids = torch.randint(5, vocab, (rows, PROMPT + RESPONSE), generator=g)
    attention_mask = torch.cat([prompt_mask, response_mask], 1)
    ids = torch.where(attention_mask.bool(), ids, tok.pad_token_id)
    position_ids = (attention_mask.cumsum(1) - 1).clamp(min=0)
    advantages = torch.randn(rows, 1, generator=g).expand(rows, RESPONSE) * response_mask
    return {"input_ids": ids, "attention_mask": attention_mask, "position_ids": position_ids,
            "response_mask": response_mask, "advantages": advantages.float()}


def run(model: FSDPModel, batch: dict, *, remove_padding: bool, response_logits_only: bool, chunk_size: int):
    """Forward + a policy-gradient-style loss (with an entropy term) + backward; returns outputs and grads."""
    model.module.zero_grad(set_to_none=True)
    out = model.forward(batch["input_ids"], batch["attention_mask"], batch["position_ids"], RESPONSE,
                        temperature=0.7, with_entropy=True, remove_padding=remove_padding, chunk_size=chunk_size,
                        response_logits_only=response_logits_only)
    mask = batch["response_mask"].float()
    loss = agg_loss(-batch["advantages"] * out.log_probs, mask) - 0.01 * agg_loss(out.entropy, mask)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.module.named_parameters()}
    return out.log_probs.detach(), out.entropy.detach(), loss.detach(), grads


VARIANTS = [
    dict(remove_padding=rp, response_logits_only=rl, chunk_size=cs)
    for rp, rl, cs in itertools.product([False, True], [False, True], [0, 5])
    if (rp, rl, cs) != (False, False, 0)
]


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(k for k, val in v.items() if val) or "plain")
def test_fast_paths_match_the_plain_forward(process_group, model_path, variant):
    torch.manual_seed(0)
    model = FSDPModel(str(model_path), FSDPConfig(shard_single_worker=True), torch.device("cpu"))
    batch = handmade_batch()
    ref_lp, ref_ent, ref_loss, ref_grads = run(model, batch, remove_padding=False, response_logits_only=False,
                                               chunk_size=0)
    lp, ent, loss, grads = run(model, batch, **variant)
    valid = batch["response_mask"].bool()
    assert torch.allclose(lp[valid], ref_lp[valid], atol=1e-5, rtol=0), (lp - ref_lp)[valid].abs().max()
    assert torch.allclose(ent[valid], ref_ent[valid], atol=1e-5, rtol=0), (ent - ref_ent)[valid].abs().max()
    assert abs(float(loss - ref_loss)) <= 1e-6 * max(1.0, abs(float(ref_loss)))
    norm = torch.sqrt(sum((g.float() ** 2).sum() for g in ref_grads.values()))
    assert norm > 0
    for name, g in ref_grads.items():
        diff = (grads[name] - g).abs().max()
        assert diff <= 1e-4 * norm, f"{name}: max |grad diff| {float(diff):.2e} vs global norm {float(norm):.2e}"


def test_response_logits_only_skips_prompt_logits(process_group, model_path, monkeypatch):
    """Packed: the LM head sees only the positions that predict a valid response token. Padded: the last
    R+1 columns (the model's `logits_to_keep`), instead of all P+R."""
    model = FSDPModel(str(model_path), FSDPConfig(shard_single_worker=True), torch.device("cpu"))
    batch = handmade_batch()
    rows_seen = []
    head = model.module.get_output_embeddings()
    handle = head.register_forward_hook(lambda m, inp, out: rows_seen.append(out.shape[:-1].numel()))
    try:
        with torch.no_grad():
            for rp in (False, True):
                model.forward(batch["input_ids"], batch["attention_mask"], batch["position_ids"], RESPONSE,
                              remove_padding=rp, response_logits_only=True)
    finally:
        handle.remove()
    rows = batch["input_ids"].shape[0]
    assert rows_seen == [rows * (RESPONSE + 1), int(batch["response_mask"].sum())]


def test_padded_path_skips_columns_no_row_uses(process_group, model_path):
    """Prompts padded far beyond the longest one in the batch: the padded path drops the shared
    left padding (the model sees 5 fewer columns) and returns the same log-probs."""
    from rlkit.workers.fsdp_model import trim_left_padding

    model = FSDPModel(str(model_path), FSDPConfig(shard_single_worker=True), torch.device("cpu"))
    batch = handmade_batch()
    extra = 5
    wide = {k: torch.nn.functional.pad(batch[k], (extra, 0), value=0)
            for k in ("input_ids", "attention_mask", "position_ids")}
    ids, mask, _ = trim_left_padding(wide["input_ids"], wide["attention_mask"], wide["position_ids"], RESPONSE)
    assert torch.equal(ids, batch["input_ids"]) and torch.equal(mask, batch["attention_mask"])
    widths = []
    handle = model.module.get_input_embeddings().register_forward_hook(lambda m, i, o: widths.append(o.shape[1]))
    try:
        with torch.no_grad():
            ref = model.forward(batch["input_ids"], batch["attention_mask"], batch["position_ids"], RESPONSE,
                                remove_padding=False).log_probs
            got = model.forward(wide["input_ids"], wide["attention_mask"], wide["position_ids"], RESPONSE,
                                remove_padding=False).log_probs
    finally:
        handle.remove()
    assert widths == [PROMPT + RESPONSE] * 2
    valid = batch["response_mask"].bool()
    assert torch.allclose(got[valid], ref[valid], atol=1e-6, rtol=0)
    # an all-padding batch is left alone
    empty = torch.zeros_like(batch["attention_mask"])
    kept = trim_left_padding(batch["input_ids"], empty, batch["position_ids"], RESPONSE)[0]
    assert kept.shape[1] == PROMPT + RESPONSE


def test_single_worker_plain_module_trains_like_fsdp(process_group, model_path):
    """One worker in float32 keeps the plain module (no FSDP2 copies/hooks): same loss and gradients
    as the FSDP2-wrapped model (1e-4 of the global norm), and the switch can force FSDP2."""
    torch.manual_seed(0)
    plain = FSDPModel(str(model_path), FSDPConfig(), torch.device("cpu"))
    sharded = FSDPModel(str(model_path), FSDPConfig(shard_single_worker=True), torch.device("cpu"))
    assert not plain.sharded and sharded.sharded
    assert not any(hasattr(p, "full_tensor") for p in plain.module.parameters())
    batch = handmade_batch()
    _, _, loss_p, grads_p = run(plain, batch, remove_padding=False, response_logits_only=True, chunk_size=0)
    _, _, loss_s, grads_s = run(sharded, batch, remove_padding=False, response_logits_only=True, chunk_size=0)
    assert abs(float(loss_p - loss_s)) <= 1e-6 * max(1.0, abs(float(loss_s)))
    norm = torch.sqrt(sum((g.float() ** 2).sum() for g in grads_s.values()))
    for name, g in grads_s.items():
        g = g.full_tensor() if hasattr(g, "full_tensor") else g
        assert (grads_p[name] - g).abs().max() <= 1e-4 * norm, name
    assert dict(plain.iter_full_params()).keys() == dict(sharded.iter_full_params()).keys()
