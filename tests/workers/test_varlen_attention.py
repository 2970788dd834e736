"""Packing without a quadratic mask: the varlen path equals the padded one and allocates nothing (T x T).

`FSDPModel.forward(remove_padding=True)` packs a micro-batch into one row whose sequence boundaries
travel as cumulative lengths to the attention function (rlkit/workers/varlen_attention.py). Checked:
log-probs, entropies and gradients equal the padded path (1e-5; float32 on CPU, the attention sums
over a different length: measured ~5e-7) on the tiny Llama with 4 heads and with grouped-query
attention (4 query heads, 2 key/value heads), for the response-logits, full-logits and fused-head
paths and the critic's values; the block-diagonal mask path remains only for models that cannot
take the function (eager attention here), and also matches. Structure instead of time (the timing is
bench/long_context.py): no tensor with two dimensions >= T is created during a packed forward and
backward, while the mask path does create one.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from rlkit.algo.loss_agg import agg_loss
from rlkit.config.schema import FSDPConfig
from rlkit.testing import build_tiny_tokenizer, save_tiny_model
from rlkit.workers.fsdp_model import FSDPModel
from rlkit.workers.varlen_attention import PREFIX, segments_from_positions

PROMPT, RESPONSE = 12, 7


@pytest.fixture(scope="module")
def model_paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    mha = save_tiny_model(root / "mha", heads=4, tie_embeddings=True)
    gqa = save_tiny_model(root / "gqa", heads=4, tie_embeddings=True)
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(gqa)
    config.num_key_value_heads = 2
    torch.manual_seed(1)
    AutoModelForCausalLM.from_config(config).save_pretrained(gqa)
    return {"mha": mha, "gqa": gqa}


def handmade_batch(rows: int = 6, prompt: int = PROMPT, response: int = RESPONSE, seed: int = 0) -> dict:
    """Left-padded prompts, right-padded responses of very different lengths (one row has no response)."""
    tok = build_tiny_tokenizer()
    g = torch.Generator().manual_seed(seed)
    prompt_len = torch.randint(2, prompt + 1, (rows,), generator=g)
    resp_len = torch.randint(1, response + 1, (rows,), generator=g)
    resp_len[min(3, rows - 1)] = 0
    prompt_mask = (torch.arange(prompt)[None, :] >= (prompt - prompt_len)[:, None]).long()
    response_mask = (torch.arange(response)[None, :] < resp_len[:, None]).long()
    attention_mask = torch.cat([prompt_mask, response_mask], 1)
    ids = torch.randint(5, len(tok), (rows, prompt + response), generator=g)
    ids = torch.where(attention_mask.bool(), ids, tok.pad_token_id)
    position_ids = (attention_mask.cumsum(1) - 1).clamp(min=0)
    advantages = torch.randn(rows, 1, generator=g).expand(rows, response) * response_mask
    return {
        "input_ids": ids,
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "response_mask": response_mask,
        "advantages": advantages.float(),
    }


def forward_backward(model: FSDPModel, batch: dict, **kw) -> tuple[torch.Tensor, torch.Tensor, dict]:
    model.module.zero_grad(set_to_none=True)
    out = model.forward(
        batch["input_ids"],
        batch["attention_mask"],
        batch["position_ids"],
        RESPONSE,
        temperature=0.7,
        with_entropy=True,
        **kw,
    )
    mask = batch["response_mask"].float()
    loss = agg_loss(-batch["advantages"] * out.log_probs, mask) - 0.01 * agg_loss(out.entropy, mask)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.module.named_parameters()}
    return out.log_probs.detach(), out.entropy.detach(), grads


def assert_same(a: tuple, b: tuple, valid: torch.Tensor) -> None:
    for x, y in zip(a[:2], b[:2]):
        assert torch.allclose(x[valid], y[valid], atol=1e-5, rtol=0), (x - y)[valid].abs().max()
    norm = torch.sqrt(sum((g**2).sum() for g in a[2].values()))
    assert norm > 0
    for name, g in a[2].items():
        assert (b[2][name] - g).abs().max() <= 1e-4 * norm, name


@pytest.mark.parametrize("kind", ["mha", "gqa"])
@pytest.mark.parametrize(
    "variant",
    [dict(), dict(response_logits_only=False), dict(fused_lm_head=True)],
    ids=["response-logits", "full-logits", "fused-head"],
)
def test_varlen_packing_matches_padded(process_group, model_paths, kind, variant):
    model = FSDPModel(str(model_paths[kind]), FSDPConfig(), torch.device("cpu"))
    assert model.varlen_reason is None and model.config._attn_implementation == PREFIX + "sdpa"
    batch = handmade_batch()
    padded = forward_backward(model, batch, remove_padding=False, **variant)
    packed = forward_backward(model, batch, remove_padding=True, **variant)
    assert_same(padded, packed, batch["response_mask"].bool())


def test_critic_values_and_gradient_checkpointing(process_group, model_paths):
    """Values through the token-classification head; with checkpointing the recompute in backward takes the
    varlen path too (the implementation name stays on the model, the bounds travel in the layer's kwargs)."""
    batch = handmade_batch()
    args = [batch[k] for k in ("input_ids", "attention_mask", "position_ids")]
    critic = FSDPModel(str(model_paths["gqa"]), FSDPConfig(), torch.device("cpu"), value_head=True)
    with torch.no_grad():
        v_pad = critic.forward(*args, RESPONSE, remove_padding=False).values
        v_packed = critic.forward(*args, RESPONSE, remove_padding=True).values
    valid = batch["response_mask"].bool()
    assert torch.allclose(v_pad[valid], v_packed[valid], atol=1e-5, rtol=0)
    plain = FSDPModel(str(model_paths["gqa"]), FSDPConfig(), torch.device("cpu"))
    ckpt = FSDPModel(str(model_paths["gqa"]), FSDPConfig(), torch.device("cpu"), gradient_checkpointing=True)
    ckpt.module.train()
    assert_same(forward_backward(plain, batch), forward_backward(ckpt, batch), valid)


def test_eager_models_keep_the_mask_path(process_group, model_paths):
    """`eager` attention is each model's own function: no wrapper, the block-diagonal mask packs (and matches)."""
    model = FSDPModel(str(model_paths["gqa"]), FSDPConfig(), torch.device("cpu"), attn_implementation="eager")
    assert "no mask-free wrapper" in model.varlen_reason
    batch = handmade_batch()
    assert_same(
        forward_backward(model, batch, remove_padding=False),
        forward_backward(model, batch),
        batch["response_mask"].bool(),
    )


def test_segments_from_positions():
    cu, longest = segments_from_positions(torch.tensor([[0, 1, 2, 0, 1, 5, 6, 7, 0]]))
    assert cu.tolist() == [0, 3, 5, 8, 9] and longest == 3


class LargestSquare(TorchDispatchMode):
    """Records the largest min(dim_i, dim_j) over every op output: T or more means a (T x T)-like tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor) and t.dim() >= 2:
                self.largest = max(self.largest, sorted(t.shape)[-2])
        return out


def test_no_quadratic_tensor(process_group, model_paths):
    """16 sequences of up to 44 tokens packed (T in the hundreds; vocab, hidden and MLP widths below it): no op
    output of the varlen forward and backward has two dimensions >= T; the mask path's (T x T) mask does."""
    batch = handmade_batch(rows=16, prompt=24, response=20, seed=3)
    tokens = int(batch["attention_mask"].sum())
    model = FSDPModel(str(model_paths["gqa"]), FSDPConfig(), torch.device("cpu"))
    with LargestSquare() as seen:
        out = model.forward(batch["input_ids"], batch["attention_mask"], batch["position_ids"], 20, with_entropy=True)
        (out.log_probs.sum() + out.entropy.sum()).backward()
    assert tokens > 300 and seen.largest < tokens, (seen.largest, tokens)
    eager = FSDPModel(str(model_paths["gqa"]), FSDPConfig(), torch.device("cpu"), attn_implementation="eager")
    with LargestSquare() as seen_mask, torch.no_grad():
        eager.forward(batch["input_ids"], batch["attention_mask"], batch["position_ids"], 20)
    assert seen_mask.largest >= tokens
