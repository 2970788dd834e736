import pytest
import torch

from rlkit.algo.value_loss import compute_value_loss

T = torch.tensor
VPREDS, VALUES = T([[1.5, 0.0, 2.0, 50.0]]), T([[1.0, 1.0, 1.0, 0.0]])
RETURNS, MASK = T([[2.0, 0.5, 1.0, 0.0]]), T([[1.0, 1.0, 1.0, 0.0]])


def test_clipped_value_loss_by_hand():
    loss, clipfrac = compute_value_loss(VPREDS, VALUES, RETURNS, MASK, cliprange_value=0.2)
    # t0: v_clip 1.2 -> max(.25, .64) = .64 (clip wins); t1: max(.25, .09); t2: max(1, .04); t3 masked
    assert loss.item() == pytest.approx(0.5 * (0.64 + 0.25 + 1.0) / 3)
    assert clipfrac.item() == pytest.approx(1 / 3)


def test_value_loss_without_clip_and_seq_mode():
    loss, clipfrac = compute_value_loss(VPREDS, VALUES, RETURNS, MASK, cliprange_value=None)
    assert loss.item() == pytest.approx(0.5 * (0.25 + 0.25 + 1.0) / 3)
    assert clipfrac.item() == 0
    loss, _ = compute_value_loss(VPREDS, VALUES, RETURNS, MASK, 0.2, loss_agg_mode="seq-mean-token-sum")
    assert loss.item() == pytest.approx(0.5 * (0.64 + 0.25 + 1.0))


def test_value_loss_gradient_only_on_valid_unclipped_tokens():
    vpreds = VPREDS.clone().requires_grad_()
    loss, _ = compute_value_loss(vpreds, VALUES, RETURNS, MASK, cliprange_value=0.2)
    loss.backward()
    # t0 is clipped (no grad through the clamp); t1: (0 - .5)/3; t2: (2 - 1)/3; t3 masked
    assert torch.allclose(vpreds.grad, T([[0.0, -0.5 / 3, 1.0 / 3, 0.0]]), atol=1e-6)
