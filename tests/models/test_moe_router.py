"""The router tap: its load-balancing loss equals transformers' own aux loss, padding is not counted, metrics."""

from __future__ import annotations

import pytest
import torch

from rlkit.models.moe_router import RouterTap
from rlkit.testing import MOE_FAMILIES, build_tiny_model, build_tiny_moe, build_tiny_tokenizer


@pytest.mark.parametrize("family", sorted(MOE_FAMILIES))
def test_load_balancing_loss_equals_transformers_aux_loss(family):
    model, _ = build_tiny_moe(family, sharpen=1.0)
    tap = RouterTap.attach(model)
    assert tap is not None and len(tap.routers) == model.config.num_hidden_layers
    ids = torch.randint(0, model.config.vocab_size, (3, 11), generator=torch.Generator().manual_seed(0))
    with tap.recording():
        out = model(input_ids=ids, output_router_logits=True)
    ours = tap.load_balancing_loss()
    torch.testing.assert_close(ours, out.aux_loss.float(), atol=1e-5, rtol=1e-5)
    ours.backward()  # differentiable in the router weights
    assert all(r.weight.grad is not None and r.weight.grad.abs().sum() > 0 for r in tap.routers)


def test_padding_tokens_are_not_counted():
    model, _ = build_tiny_moe("qwen3_moe", sharpen=1.0)
    tap = RouterTap.attach(model)
    ids = torch.randint(0, model.config.vocab_size, (1, 7), generator=torch.Generator().manual_seed(1))
    with tap.recording():
        model(input_ids=ids)
    alone = tap.load_balancing_loss()
    padded = torch.cat([torch.zeros(1, 5, dtype=torch.long), ids], dim=1)
    mask = torch.cat([torch.zeros(1, 5, dtype=torch.long), torch.ones(1, 7, dtype=torch.long)], dim=1)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with tap.recording():
        model(input_ids=padded, attention_mask=mask, position_ids=pos)
    assert sum(x.shape[0] for x in tap.indices) == 7 * model.config.num_hidden_layers
    torch.testing.assert_close(tap.load_balancing_loss(), alone, atol=1e-5, rtol=1e-5)


def test_load_metrics_and_no_recording_outside_the_context():
    model, _ = build_tiny_moe("qwen3_moe", sharpen=1.0)
    tap = RouterTap.attach(model)
    model(input_ids=torch.ones(1, 4, dtype=torch.long))
    assert tap.indices == []  # not recording
    with tap.recording():
        model(input_ids=torch.ones(1, 4, dtype=torch.long))  # 4 identical tokens -> top-2 of 8 experts used
    m = tap.load_metrics()
    assert m["moe/dropped_or_unused_experts"] == pytest.approx(6 / 8)
    assert m["moe/expert_load_max_over_mean"] == pytest.approx(8 / 2)


def test_dense_models_have_no_routers():
    assert RouterTap.attach(build_tiny_model(build_tiny_tokenizer())) is None
