import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlkit.algo.loss_agg import LOSS_AGG
from rlkit.algo.policy_loss import POLICY_LOSSES

T = torch.tensor
RATIOS = [0.5, 1.1, 1.5, 0.7, 5.0, 40.0]  # the last token is masked out
ADV = T([[1.0, 1.0, 1.0, -1.0, -1.0, -7.0]])
MASK = T([[1.0, 1.0, 1.0, 1.0, 1.0, 0.0]])
LOGP = torch.log(T([RATIOS]))
OLD = torch.zeros(1, 6)
KW = dict(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0)


def test_registry_names():
    assert POLICY_LOSSES.names() == ["cispo", "clip_cov", "dppo_kl", "dppo_tv", "dro", "geo_mean", "gmpo", "gpg",
                                     "gspo", "kl_cov", "ppo", "sapo", "vanilla", "vespo"]
    assert POLICY_LOSSES.get("ppo") is POLICY_LOSSES.get("vanilla")


def test_vanilla_by_hand():
    out = POLICY_LOSSES.get("vanilla")(OLD, LOGP, ADV, MASK, **KW)
    # per token: -0.5 (r<1-low but A>0: unclipped), -1.1, -1.28 (clip-higher), 0.8 (A<0, r<1-low clipped),
    # 5 -> dual-clip cap 3
    assert out["pg_loss"].item() == pytest.approx((-0.5 - 1.1 - 1.28 + 0.8 + 3.0) / 5, abs=1e-6)
    assert out["pg_clipfrac"].item() == pytest.approx(2 / 5)
    assert out["pg_clipfrac_lower"].item() == pytest.approx(1 / 5)
    ppo_kl = -sum(math.log(r) for r in RATIOS[:5]) / 5
    assert out["ppo_kl"].item() == pytest.approx(ppo_kl, abs=1e-6)
    assert set(out) == {"pg_loss", "pg_clipfrac", "ppo_kl", "pg_clipfrac_lower"}


def test_vanilla_without_dual_clip_and_with_is_weights():
    no_dual = POLICY_LOSSES.get("vanilla")(OLD, LOGP, ADV, MASK, **{**KW, "clip_ratio_c": None})
    assert no_dual["pg_loss"].item() == pytest.approx((-0.5 - 1.1 - 1.28 + 0.8 + 5.0) / 5, abs=1e-6)
    assert no_dual["pg_clipfrac_lower"].item() == 0
    w = T([[2.0, 1.0, 1.0, 1.0, 0.5, 100.0]])
    out = POLICY_LOSSES.get("vanilla")(OLD, LOGP, ADV, MASK, rollout_is_weights=w, **KW)
    assert out["pg_loss"].item() == pytest.approx((-1.0 - 1.1 - 1.28 + 0.8 + 1.5) / 5, abs=1e-6)
    with pytest.raises(ValueError, match="clip_ratio_c"):
        POLICY_LOSSES.get("vanilla")(OLD, LOGP, ADV, MASK, clip_ratio_c=0.9)


def test_vanilla_agg_mode_is_forwarded():
    out = POLICY_LOSSES.get("vanilla")(OLD, LOGP, ADV, MASK, loss_agg_mode="seq-mean-token-sum", **KW)
    assert out["pg_loss"].item() == pytest.approx(-0.5 - 1.1 - 1.28 + 0.8 + 3.0, abs=1e-5)


def test_gspo_by_hand():
    old = torch.zeros(2, 3)
    logp = torch.log(T([[1.1, 1.1, 1.0], [2.0, 0.5, 9.0]]))
    adv = T([[1.0, 1.0, 0.0], [-1.0, -1.0, 0.0]])
    mask = T([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    out = POLICY_LOSSES.get("gspo")(old, logp, adv, mask)
    # s0 = 1.1 (inside [0.8, 1.2]), s1 = exp(mean(log 2, log .5)) = 1
    assert out["pg_loss"].item() == pytest.approx((-1.1 * 2 + 1.0 * 2) / 4, abs=1e-6)
    assert out["pg_clipfrac"].item() == 0
    logp2 = torch.log(T([[1.3, 1.3, 1.0], [2.0, 0.5, 9.0]]))
    out2 = POLICY_LOSSES.get("gspo")(old, logp2, adv, mask)
    assert out2["pg_loss"].item() == pytest.approx((-1.2 * 2 + 1.0 * 2) / 4, abs=1e-6)
    assert out2["pg_clipfrac"].item() == pytest.approx(0.5)


def test_gspo_gradient_is_sequence_ratio_per_token():
    old = torch.zeros(2, 3)
    logp = torch.log(T([[1.1, 1.1, 1.0], [2.0, 0.5, 9.0]])).requires_grad_()
    adv = T([[1.0, 1.0, 0.0], [-1.0, -1.0, 0.0]])
    mask = T([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    POLICY_LOSSES.get("gspo")(old, logp, adv, mask, loss_agg_mode="seq-mean-token-mean")["pg_loss"].backward()
    # d/dlogp_t = -A_i * s_i / (|y_i| * n_seqs): row0 -1*1.1/4, row1 +1*1/4, masked 0
    assert torch.allclose(logp.grad, T([[-0.275, -0.275, 0.0], [0.25, 0.25, 0.0]]), atol=1e-6)


@pytest.mark.parametrize("name", ["vanilla", "gspo"])
@pytest.mark.parametrize("mode", LOSS_AGG.names())
def test_masked_tokens_get_no_gradient(name, mode):
    torch.manual_seed(0)
    mask = T([[1.0, 1.0, 0.0, 0.0], [1.0, 0.0, 1.0, 0.0]])
    logp = (torch.randn(2, 4) * 3).requires_grad_()
    old = torch.randn(2, 4)
    adv = torch.randn(2, 4)
    w = torch.rand(2, 4)
    out = POLICY_LOSSES.get(name)(old, logp, adv, mask, loss_agg_mode=mode, rollout_is_weights=w)
    out["pg_loss"].backward()
    assert torch.isfinite(logp.grad).all()
    assert (logp.grad[mask == 0] == 0).all()
    assert not out["pg_clipfrac"].requires_grad and not out["ppo_kl"].requires_grad


FINITE = st.floats(-3.0, 3.0, allow_nan=False)


@settings(max_examples=60, deadline=None)
@given(log_ratio=FINITE, adv=st.floats(-5, 5).filter(lambda a: abs(a) > 1e-3))
def test_clip_bounds_and_clipfrac(log_ratio, adv):
    low, high, c = 0.2, 0.28, 3.0
    ratio = math.exp(log_ratio)
    logp = T([[log_ratio]]).requires_grad_()
    out = POLICY_LOSSES.get("vanilla")(
        torch.zeros(1, 1), logp, T([[adv]]), torch.ones(1, 1), clip_ratio_low=low, clip_ratio_high=high, clip_ratio_c=c
    )
    loss = out["pg_loss"]
    loss.backward()
    # the objective -loss never exceeds the clipped one: A>0 gains at most A(1+high); A<0 at most A(1-low)
    assert loss.item() >= -adv * (1 + high if adv > 0 else 1 - low) - 1e-5
    if adv < 0:  # dual-clip: loss capped at -A*c
        assert loss.item() <= -adv * c + 1e-5
    outside = (adv > 0 and ratio > 1 + high) or (adv < 0 and ratio < 1 - low)
    if abs(ratio - (1 + high)) > 1e-5 and abs(ratio - (1 - low)) > 1e-5:
        assert out["pg_clipfrac"].item() == float(outside)
        lower = adv < 0 and ratio > c
        if abs(ratio - c) > 1e-5:
            assert out["pg_clipfrac_lower"].item() == float(lower)
            if outside or lower:  # clipped tokens carry no gradient
                assert logp.grad.item() == 0
            else:
                assert logp.grad.item() == pytest.approx(-adv * ratio, rel=1e-4)
