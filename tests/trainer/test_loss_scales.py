"""`loss_scales`: micro-batch losses reweighted so their sum is the loss of the whole mini-batch."""

from __future__ import annotations

import pytest
import torch

from rlkit.algo.loss_agg import LOSS_AGG, agg_loss
from rlkit.workers.micro_batch import loss_scales


@pytest.mark.parametrize("mode", LOSS_AGG.names())
def test_weighted_micro_losses_equal_the_mini_batch_loss(mode):
    g = torch.Generator().manual_seed(0)
    loss_mat = torch.randn(10, 7, generator=g)
    lengths = torch.tensor([7, 1, 0, 3, 7, 2, 5, 1, 6, 4])  # an empty row too (a sample with no trained token)
    mask = (torch.arange(7)[None] < lengths[:, None]).float()
    whole = agg_loss(loss_mat, mask, mode)
    parts = [slice(0, 3), slice(3, 4), slice(4, 10)]  # uneven micro-batches
    scales = loss_scales([mask[p] for p in parts], mode)
    total = sum(agg_loss(loss_mat[p], mask[p], mode) * w for p, w in zip(parts, scales))
    assert float(total) == pytest.approx(float(whole), rel=1e-5, abs=1e-7)


def test_token_mean_weights_by_tokens_not_rows():
    masks = [torch.ones(2, 6), torch.ones(2, 1)]  # 12 tokens and 2 tokens
    assert loss_scales(masks, "token-mean") == pytest.approx([12 / 14, 2 / 14])
    assert loss_scales([torch.zeros(2, 3)], "token-mean") == [0.0]  # nothing to train: no gradient, no nan
