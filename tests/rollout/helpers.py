"""Shared pieces of the rollout tests: a tiny model both backends load, prompts, reference log-probs."""

from __future__ import annotations

from pathlib import Path

import torch

from rlkit.protocol import Batch
from rlkit.testing import build_tiny_tokenizer, save_tiny_model

VLLM_RESPONSE_LENGTH = 16  # the shared vLLM engine's response length (conftest `vllm_config`)
PROMPTS = [
    "copy the digits : 1 2 3",
    "reverse 4 5",
    "what is 2 + 2 ?",
    "<|im_start|> user think step by step : 7 * 8 = <|im_end|> <|im_start|> assistant",
]


def save_test_model(path: str | Path, sharpen: float = 8.0, seed: int = 0) -> Path:
    """The tiny random Llama with 2 heads (head_dim 32: vLLM's CPU attention has no head_dim 16 kernel)
    and a scaled lm_head, so greedy argmax margins are far above float32 kernel noise."""
    from transformers import AutoModelForCausalLM

    path = save_tiny_model(path, heads=2, seed=seed)
    model = AutoModelForCausalLM.from_pretrained(path)
    with torch.no_grad():
        model.lm_head.weight.mul_(sharpen)
    model.save_pretrained(path)
    return Path(path)


def make_prompts(texts: list[str] = PROMPTS, tokenizer=None) -> Batch:
    """Left-padded prompts as the dataset hands them over, plus a non-tensor column to carry through."""
    tokenizer = tokenizer or build_tiny_tokenizer()
    enc = tokenizer(texts, padding=True, return_tensors="pt")
    mask = enc["attention_mask"]
    pos = (mask.cumsum(dim=1) - 1).clamp(min=0)
    return Batch(
        {"input_ids": enc["input_ids"], "attention_mask": mask, "position_ids": pos},
        {"uid": [f"p{i}" for i in range(len(texts))]},
        {"note": "kept"},
    )


def reference_log_probs(model, out: Batch, temperature: float = 1.0, top_k: int = -1) -> torch.Tensor:
    """log p(response token) from one full forward pass: logits / T, top-k mask, log_softmax."""
    prompt_len = out["prompts"].shape[1]
    with torch.no_grad():
        logits = model(
            input_ids=out["input_ids"], attention_mask=out["attention_mask"], position_ids=out["position_ids"]
        ).logits.float()
    logits = logits[:, prompt_len - 1 : -1] / temperature
    if top_k > 0:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    lp = torch.log_softmax(logits, dim=-1).gather(-1, out["responses"].unsqueeze(-1)).squeeze(-1)
    return torch.where(out["response_mask"].bool(), lp, 0.0)


def perturbed_state(model, seed: int = 1, scale: float = 0.3) -> dict[str, torch.Tensor]:
    """A new full state dict: every tensor moved by `scale` relative noise."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, t in model.state_dict().items():
        noise = torch.randn(t.shape, generator=gen, dtype=t.dtype)
        out[name] = t + scale * t.abs().mean() * noise
    return out


def check_layout(out: Batch, prompts: Batch, response_length: int, stop_ids: list[int], pad_id: int) -> None:
    """Every invariant of the rollout output layout (see rlkit/rollout/base.py)."""
    rows, prompt_len = prompts["input_ids"].shape
    resp, mask = out["responses"], out["response_mask"]
    assert resp.shape == mask.shape == (rows, response_length)
    assert out["input_ids"].shape == out["attention_mask"].shape == out["position_ids"].shape
    assert out["input_ids"].shape == (rows, prompt_len + response_length)
    assert torch.equal(out["prompts"], prompts["input_ids"])
    assert torch.equal(out["input_ids"], torch.cat([prompts["input_ids"], resp], dim=1))
    assert torch.equal(out["attention_mask"], torch.cat([prompts["attention_mask"], mask], dim=1))
    last = prompts["position_ids"][:, -1:]
    assert torch.equal(out["position_ids"][:, prompt_len:], last + torch.arange(1, response_length + 1))
    lengths = mask.sum(dim=1)
    for i in range(rows):
        n = int(lengths[i])
        assert n >= 1
        assert mask[i, :n].all() and not mask[i, n:].any(), "response_mask must be a prefix of ones"
        assert (resp[i, n:] == pad_id).all(), "padding after the end"
        body = resp[i, : n - 1].tolist()
        assert not set(body) & set(stop_ids), "no stop token before the last valid token"
        if n < response_length:
            assert int(resp[i, n - 1]) in stop_ids, "a short response ends with its stop token"
    assert out.non_tensors["uid"].tolist() == prompts.non_tensors["uid"].tolist()
    assert out.meta["note"] == "kept"
