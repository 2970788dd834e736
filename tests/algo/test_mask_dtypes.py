"""Rollout may hand over response_mask as long, bool or float; results must not depend on it."""

import numpy as np
import pytest
import torch

from rlkit.algo import ADV_ESTIMATORS, LOSS_AGG, POLICY_LOSSES, AdvantageInputs, compute_value_loss

torch.manual_seed(0)
MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 1, 1], [1, 1, 0, 0], [1, 1, 1, 1]])
REWARDS = torch.randn(4, 4)
VALUES = torch.randn(4, 4)
UIDS = np.array(["a", "a", "b", "b"], dtype=object)


@pytest.mark.parametrize("dtype", [torch.long, torch.bool])
def test_estimators_agree_across_mask_dtypes(dtype):
    kw = dict(index=UIDS, values=VALUES, gamma=0.9, lam=0.95, reward_baselines=torch.zeros(4),
              reward_components={"acc": torch.tensor([1.0, 0.0, 1.0, 1.0])},
              old_log_probs=torch.full_like(REWARDS, -1.0), sum_pi_squared=torch.full_like(REWARDS, 0.5))
    for name in ADV_ESTIMATORS:
        fn = ADV_ESTIMATORS.get(name)
        ref = fn(AdvantageInputs(REWARDS, MASK.float(), **kw))
        got = fn(AdvantageInputs(REWARDS, MASK.to(dtype), **kw))
        for a, b in zip(ref, got):
            assert a.dtype == torch.float32
            assert torch.allclose(a, b, atol=1e-6), name


@pytest.mark.parametrize("dtype", [torch.long, torch.bool])
def test_losses_agree_across_mask_dtypes(dtype):
    old, logp, adv = torch.randn(4, 4), torch.randn(4, 4), torch.randn(4, 4)
    for mode in LOSS_AGG:
        for name in POLICY_LOSSES:
            torch.manual_seed(0)  # clip_cov draws its tokens at random
            ref = POLICY_LOSSES.get(name)(old, logp, adv, MASK.float(), loss_agg_mode=mode, dro_beta=0.1)
            torch.manual_seed(0)
            got = POLICY_LOSSES.get(name)(old, logp, adv, MASK.to(dtype), loss_agg_mode=mode, dro_beta=0.1)
            for key in ref:
                assert torch.allclose(ref[key], got[key], atol=1e-6), (name, mode, key)
        ref_v = compute_value_loss(logp, old, adv, MASK.float(), 0.2, mode)
        got_v = compute_value_loss(logp, old, adv, MASK.to(dtype), 0.2, mode)
        assert all(torch.allclose(a, b) for a, b in zip(ref_v, got_v))
