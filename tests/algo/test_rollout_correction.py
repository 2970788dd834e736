"""Rollout correction (rlkit.algo.rollout_correction) on handmade ratios: every level's weights and masks exactly.

Three responses of 3, 2 and 4 valid tokens with token ratios pi_old / pi_rollout

    row 0   2     0.5   4     | pad
    row 1   1.5   1     | pad   pad
    row 2   1.25  0.8   1     1

so the sequence ratios are 4, 1.5, 1 and the geometric means 4^(1/3), 1.5^(1/2), 1. Padding carries
absurd log-ratios (+-50): were it counted anywhere, every number below would change.
"""

from __future__ import annotations

import math

import pytest
import torch

from rlkit.algo import POLICY_LOSSES
from rlkit.algo.rollout_correction import MAX_LOG_RATIO, RATIO_LEVELS, RolloutCorrection
from rlkit.errors import UserError

RATIOS = [[2.0, 0.5, 4.0, 1.0], [1.5, 1.0, 1.0, 1.0], [1.25, 0.8, 1.0, 1.0]]
MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
VALID_TOKENS = 9
PAD_LOG_RATIO = torch.tensor([[0, 0, 0, 50.0], [0, 0, -50.0, 50.0], [0, 0, 0, 0]])


def log_probs(pad: torch.Tensor = PAD_LOG_RATIO) -> tuple[torch.Tensor, torch.Tensor]:
    """(old, rollout) log-probs whose difference is log RATIOS on valid tokens and `pad` on padding."""
    rollout = torch.full((3, 4), -1.3)
    old = rollout + torch.tensor(RATIOS).log() + pad
    return old, rollout


def correct(**kw) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    old, rollout = log_probs()
    out = RolloutCorrection(**kw)(old, rollout, MASK)
    return out.weights, out.kept, out.metrics


def close(actual: torch.Tensor, expected: list[list[float]]) -> None:
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=torch.float32), rtol=1e-5, atol=1e-6)


def test_registered_levels():
    assert RATIO_LEVELS.names() == ["geometric", "sequence", "token"]


def test_token_is_is_todays_truncated_weight():
    weights, kept, metrics = correct(is_level="token", is_threshold=3.0)
    close(weights, [[2, 0.5, 3, 0], [1.5, 1, 0, 0], [1.25, 0.8, 1, 1]])
    old, rollout = log_probs()
    close(weights, (torch.exp(old - rollout).clamp(max=3.0) * MASK).tolist())  # the formula before this module
    assert torch.equal(kept, MASK.bool())
    assert metrics["rollout_corr/is_weight_max"] == pytest.approx(3.0)
    assert metrics["rollout_corr/is_weight_mean"] == pytest.approx((2 + 0.5 + 3 + 1.5 + 1 + 1.25 + 0.8 + 1 + 1) / 9)
    assert metrics["rollout_corr/is_truncated_frac"] == pytest.approx(1 / VALID_TOKENS)
    assert metrics["rollout_corr/token_ratio_max"] == pytest.approx(4.0)
    assert metrics["rollout_corr/token_ratio_min"] == pytest.approx(0.5)
    assert "rollout_corr/masked_token_frac" not in metrics  # no rejection configured


def test_sequence_is_is_the_truncated_product_over_valid_tokens():
    weights, _, metrics = correct(is_level="sequence", is_threshold=3.0)
    close(weights, [[3, 3, 3, 0], [1.5, 1.5, 0, 0], [1, 1, 1, 1]])  # products 4 (-> 3), 1.5, 1
    assert metrics["rollout_corr/is_truncated_frac"] == pytest.approx(3 / VALID_TOKENS)  # row 0's three tokens
    weights, _, _ = correct(is_level="sequence", is_threshold=10.0)
    close(weights, [[4, 4, 4, 0], [1.5, 1.5, 0, 0], [1, 1, 1, 1]])


def test_geometric_is_is_the_geometric_mean():
    weights, _, _ = correct(is_level="geometric", is_threshold=10.0)
    g0, g1 = 4 ** (1 / 3), 1.5**0.5
    close(weights, [[g0, g0, g0, 0], [g1, g1, 0, 0], [1, 1, 1, 1]])


def test_token_rejection_masks_tokens_outside_the_bounds():
    weights, kept, metrics = correct(rs_level="token", rs_lower=0.6, rs_upper=2.5)
    close(weights, [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1]])  # 0.5 and 4 rejected, 0.8 and 2 kept
    assert torch.equal(kept, weights.bool())
    assert metrics["rollout_corr/masked_token_frac"] == pytest.approx(2 / VALID_TOKENS)
    assert metrics["rollout_corr/masked_seq_frac"] == 0.0  # no row lost all its tokens
    assert "rollout_corr/is_weight_mean" not in metrics  # no importance sampling configured


def test_sequence_rejection_masks_whole_rows():
    weights, _, metrics = correct(rs_level="sequence", rs_lower=0.5, rs_upper=2.0)
    close(weights, [[0, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1]])  # product 4 > 2
    assert metrics["rollout_corr/masked_token_frac"] == pytest.approx(3 / VALID_TOKENS)
    assert metrics["rollout_corr/masked_seq_frac"] == pytest.approx(1 / 3)
    weights, _, metrics = correct(rs_level="sequence", rs_lower=1.1, rs_upper=5.0)  # lower bound: row 2 (1) out
    close(weights, [[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]])
    assert metrics["rollout_corr/masked_seq_frac"] == pytest.approx(1 / 3)


def test_geometric_rejection_is_length_normalised():
    weights, _, metrics = correct(rs_level="geometric", rs_lower=0.9, rs_upper=1.2)
    close(weights, [[0, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]])  # 1.587 and 1.2247 above 1.2
    assert metrics["rollout_corr/masked_token_frac"] == pytest.approx(5 / VALID_TOKENS)
    assert metrics["rollout_corr/masked_seq_frac"] == pytest.approx(2 / 3)
    weights, _, _ = correct(rs_level="geometric", rs_lower=0.9, rs_upper=1.3)
    close(weights, [[0, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1]])


def test_importance_weights_and_rejection_combine():
    """OpenRLHF's seq-mask-tis: token IS weights, rows rejected by their geometric mean."""
    weights, _, metrics = correct(is_level="token", is_threshold=3.0, rs_level="geometric", rs_lower=0.9, rs_upper=1.3)
    close(weights, [[0, 0, 0, 0], [1.5, 1, 0, 0], [1.25, 0.8, 1, 1]])
    assert metrics["rollout_corr/is_weight_max"] == pytest.approx(3.0)  # IS metrics: before rejection
    assert metrics["rollout_corr/masked_seq_frac"] == pytest.approx(1 / 3)


@pytest.mark.parametrize(
    "kw",
    [
        {"is_level": "token", "is_threshold": 3.0},
        {"is_level": "sequence"},
        {"is_level": "geometric", "rs_level": "sequence", "rs_lower": 0.5, "rs_upper": 3.0},
        {"rs_level": "token", "rs_lower": 0.6, "rs_upper": 2.5},
    ],
)
def test_padding_never_counts(kw):
    old, rollout = log_probs()
    base = RolloutCorrection(**kw)(old, rollout, MASK)
    inf = torch.where(MASK.bool(), 0.0, float("inf"))
    for pad in (torch.zeros(3, 4), PAD_LOG_RATIO * -1000, inf):  # nothing, far beyond the log-ratio bound, inf
        other = RolloutCorrection(**kw)(*log_probs(pad), MASK)
        assert torch.equal(other.weights, base.weights) and other.metrics == base.metrics
    assert not base.weights[MASK == 0].any()
    empty = RolloutCorrection(**kw)(old, rollout, torch.zeros_like(MASK))  # nothing valid: zero weights, no NaN
    assert not empty.weights.any() and all(math.isfinite(v) for v in empty.metrics.values())


def test_a_diverged_sample_gives_finite_weights():
    rollout = torch.full((1, 3), -200.0)
    old = torch.zeros(1, 3)  # ratio e^200 per token
    out = RolloutCorrection(is_level="sequence", is_threshold=1e30)(old, rollout, torch.ones(1, 3))
    assert torch.isfinite(out.weights).all()
    torch.testing.assert_close(out.weights, torch.full((1, 3), math.exp(MAX_LOG_RATIO)))


def test_rejected_tokens_add_no_gradient_and_keep_their_place_in_the_token_mean():
    """The documented normalisation: loss = sum(weight x token loss) / all valid tokens."""
    old, rollout = log_probs()
    corr = RolloutCorrection(rs_level="sequence", rs_lower=0.5, rs_upper=2.0)(old, rollout, MASK)
    logp = old.clone().requires_grad_(True)
    adv = torch.tensor([[1.0] * 4, [-1.0] * 4, [2.0] * 4])
    out = POLICY_LOSSES.get("vanilla")(old, logp, adv, MASK.float(), rollout_is_weights=corr.weights)
    out["pg_loss"].backward()
    assert not logp.grad[0].any()  # row 0 rejected: no gradient at all
    kept_sum = (-adv * corr.weights).sum()  # ratio 1 at logp == old: token loss -A
    assert float(out["pg_loss"].detach()) == pytest.approx(float(kept_sum) / VALID_TOKENS)


def test_bad_settings_are_refused():
    with pytest.raises(UserError, match="Known: geometric, sequence, token"):
        RolloutCorrection(is_level="seq")
    with pytest.raises(ValueError, match="0 < lower < upper"):
        RolloutCorrection(rs_level="token", rs_lower=2.0, rs_upper=1.5)
    with pytest.raises(ValueError, match="is_threshold must be > 0"):
        RolloutCorrection(is_level="token", is_threshold=0.0)


def test_verls_rejection_modes_by_hand():
    """verl's modes on the handmade ratios: k1 bounds are on pi_rollout / pi_old (1/r), k2 = (log r)^2 / 2 and
    k3 = r - 1 - log r take an upper bound; a row-level mode keeps or drops whole rows; all listed modes must keep."""
    from rlkit.config.rejection_modes import parse_rules

    def kept(modes: str, threshold: str) -> list[list[int]]:
        return correct(rs_rules=parse_rules(modes, threshold))[1].int().tolist()

    # token_k1 with 1/r in [0.3, 1.0]: keeps 1 <= r <= 3.33 (2 | 1.5, 1 | 1.25, 1, 1); drops 0.5, 4 and 0.8
    assert kept("token_k1", "0.3_1.0") == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 1]]
    # token_k2 <= 0.3: (log 2)^2/2 = 0.24 kept, (log 4)^2/2 = 0.96 dropped
    assert kept("token_k2", "0.3") == [[1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1]]
    # seq_max_k3 <= 0.5: row 0 holds r = 4 (k3 = 4 - 1 - log 4 = 1.61): the whole row goes
    assert kept("seq_max_k3", "0.5") == [[0, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1]]
    # seq_sum_k1 with one number u: 1/u <= prod 1/r <= u; prod r = 4, 1.5, 1 -> 1/4 is outside [1/2, 2]
    assert kept("seq_sum_k1", "2") == [[0, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1]]
    # two modes: both must keep
    assert kept("token_k1,seq_max_k3", "0.3_1.0,0.5") == [[0, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 1]]
    weights = correct(rs_rules=parse_rules("seq_max_k3", "0.5"))[0]
    assert weights[0].sum() == 0 and weights[2].sum() == 4


def test_bypass_weighs_the_current_policy_and_ppo_clip_ignores_is():
    """In bypass_mode the old log-probs are the engine's, so the actor passes the current (detached) log-probs: the
    weight is pi / pi_rollout. With ppo_clip (apply_is off) only rejection acts; the batch normalisation of a bypass
    run averages the weights over the micro-batch it sees (verl computes them inside the loss)."""
    old, rollout = log_probs()
    reinforce = RolloutCorrection(is_level="token", is_threshold=3.0, bypass=True, batch_normalize=True)(
        old, rollout, MASK)
    raw = torch.tensor(RATIOS).clamp(max=3.0) * MASK
    assert torch.allclose(reinforce.weights, raw / (raw.sum() / VALID_TOKENS))
    clip = RolloutCorrection(is_level="token", bypass=True, apply_is=False, rs_level="token", rs_lower=0.6,
                             rs_upper=3.0)(old, rollout, MASK)
    assert clip.weights.tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1]]
