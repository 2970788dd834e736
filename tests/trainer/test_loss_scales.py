"""`loss_scales`: micro-batch losses reweighted so their sum is the loss of the whole mini-batch."""

from __future__ import annotations

import pytest
import torch

from rlkit.algo.loss_agg import LOSS_AGG, agg_loss
from rlkit.algo.policy_loss import POLICY_LOSSES
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


#: settings under which a loss's token selection does not depend on the split: kl_cov penalises every token,
#: clip_cov drops every unclipped one; at their defaults both select within each micro-batch (as verl does),
#: so there the sum over micro-batches is not the full-batch loss (docs/algorithms.md says so)
SPLIT_INVARIANT = {"kl_cov": {"kl_cov_ratio": 1.0}, "dro": {"dro_beta": 0.1},
                   "clip_cov": {"clip_cov_ratio": 1.0, "clip_cov_lb": -1e9, "clip_cov_ub": 1e9}}


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "token-sum"])
@pytest.mark.parametrize("name", POLICY_LOSSES.names())
def test_every_policy_loss_adds_up_over_micro_batches(name, mode):
    """Each registered policy loss, scaled by `loss_scales`, sums over uneven micro-batches to its full-batch value."""
    g = torch.Generator().manual_seed(1)
    lengths = torch.tensor([7, 1, 0, 3, 7, 2, 5, 1, 6, 4])
    mask = (torch.arange(7)[None] < lengths[:, None]).float()
    log_prob = -torch.rand(10, 7, generator=g, dtype=torch.float64) * 3
    old = (log_prob + 0.3 * torch.randn(10, 7, generator=g, dtype=torch.float64)).clamp(max=-1e-3)
    adv = torch.randn(10, 7, generator=g, dtype=torch.float64)
    loss = POLICY_LOSSES.get(name)
    kw = {"loss_agg_mode": mode, **SPLIT_INVARIANT.get(name, {})}
    whole = loss(old, log_prob, adv, mask, **kw)["pg_loss"]
    parts = [slice(0, 3), slice(3, 4), slice(4, 10)]
    scales = loss_scales([mask[p] for p in parts], mode)
    total = sum(loss(old[p], log_prob[p], adv[p], mask[p], **kw)["pg_loss"] * w for p, w in zip(parts, scales))
    assert float(total) == pytest.approx(float(whole), rel=1e-9, abs=1e-12)
