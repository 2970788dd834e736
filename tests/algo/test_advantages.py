import inspect

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlkit.algo.advantages import ADV_ESTIMATORS, AdvantageInputs, discounted_returns, gae_unwhitened
from rlkit.algo.needs import Needs, needs_of
from rlkit.errors import UserError

T = torch.tensor
MAX = dict(max_examples=40, deadline=None)


def outcome_batch(scores, lengths, width=3):
    """Rewards on the last valid token of each row, like the reward manager writes them."""
    rewards = torch.zeros(len(scores), width)
    mask = torch.zeros(len(scores), width)
    for i, (s, n) in enumerate(zip(scores, lengths)):
        mask[i, :n] = 1
        rewards[i, n - 1] = s
    return rewards, mask


def per_row(adv, mask):
    """The advantage each row broadcasts (checks it is constant over valid tokens)."""
    out = []
    for a, m in zip(adv, mask):
        vals = a[m.bool()]
        assert torch.allclose(vals, vals[0].expand_as(vals))
        assert (a[~m.bool()] == 0).all()
        out.append(vals[0].item())
    return out


UIDS = np.array(["a", "a", "a", "b", "b", "c"], dtype=object)
REWARDS, MASK = outcome_batch([1.0, 0.0, 0.0, 1.0, 1.0, 5.0], [3, 1, 2, 2, 3, 1])


def test_registry_names_and_shared_signature():
    assert ADV_ESTIMATORS.names() == [
        "gae",
        "gdpo",
        "gpg",
        "grpo",
        "grpo_passk",
        "grpo_vectorized",
        "opo",
        "optimal_token_baseline",
        "reinforce_plus_plus",
        "reinforce_plus_plus_baseline",
        "remax",
        "rloo",
        "rloo_vectorized",
        "tir_optimal_token_baseline",
    ]
    inputs = AdvantageInputs(
        REWARDS,
        MASK,
        index=UIDS,
        values=torch.zeros_like(REWARDS),
        gamma=1.0,
        lam=1.0,
        norm_adv_by_std=True,
        epsilon=1e-6,
        reward_baselines=torch.zeros(6),
        reward_components={"acc": torch.arange(6.0), "fmt": torch.ones(6)},
        old_log_probs=torch.full_like(REWARDS, -1.0),
        sum_pi_squared=torch.full_like(REWARDS, 0.5),
    )
    for name in ADV_ESTIMATORS:
        fn = ADV_ESTIMATORS.get(name)
        params = inspect.signature(fn).parameters
        assert list(params) == ["inputs"]  # one typed input: the trainer passes everything it has
        adv, ret = fn(inputs)
        assert adv.shape == ret.shape == REWARDS.shape
        assert (adv[MASK == 0] == 0).all(), name
    with pytest.raises(UserError, match="grpo"):
        ADV_ESTIMATORS.get("grpoo")


def test_grpo_by_hand():
    adv, ret = ADV_ESTIMATORS.get("grpo")(AdvantageInputs(REWARDS, MASK, index=UIDS))
    # group a: mean 1/3, unbiased std sqrt(1/3); group b: std 0 -> 0; group c: single -> its score (verl)
    expected = [1.1547005, -0.5773503, -0.5773503, 0.0, 0.0, 5.0]
    assert per_row(adv, MASK) == pytest.approx(expected, abs=1e-5)
    assert torch.equal(adv, ret)


def test_dr_grpo_by_hand():
    adv, _ = ADV_ESTIMATORS.get("grpo")(AdvantageInputs(REWARDS, MASK, index=UIDS, norm_adv_by_std=False))
    assert per_row(adv, MASK) == pytest.approx([2 / 3, -1 / 3, -1 / 3, 0.0, 0.0, 5.0], abs=1e-6)


def test_rloo_by_hand():
    adv, _ = ADV_ESTIMATORS.get("rloo")(AdvantageInputs(REWARDS, MASK, index=UIDS))
    # a: 1 - mean(0,0) = 1, 0 - mean(1,0) = -0.5; c alone: its score (verl)
    assert per_row(adv, MASK) == pytest.approx([1.0, -0.5, -0.5, 0.0, 0.0, 5.0], abs=1e-6)


def test_group_estimators_need_uids():
    for name in ("grpo", "rloo", "reinforce_plus_plus_baseline"):
        with pytest.raises(UserError, match="uid"):
            ADV_ESTIMATORS.get(name)(AdvantageInputs(REWARDS, MASK))
    with pytest.raises(ValueError, match="index"):
        ADV_ESTIMATORS.get("grpo")(AdvantageInputs(REWARDS, MASK, index=UIDS[:3]))


def test_gae_by_hand_and_masked_middle_token():
    gamma, lam = 0.9, 0.8
    rewards, values, mask = T([[0.0, 0.0, 1.0]]), T([[0.5, 0.6, 0.7]]), torch.ones(1, 3)
    adv, ret = gae_unwhitened(rewards, values, mask, gamma, lam)
    # A2 = 1 - .7 = .3; A1 = (.9*.7 - .6) + .72*.3 = .246; A0 = (.9*.6 - .5) + .72*.246 = .21712
    assert torch.allclose(adv, T([[0.21712, 0.246, 0.3]]), atol=1e-6)
    assert torch.allclose(ret, T([[0.71712, 0.846, 1.0]]), atol=1e-6)
    # a tool token (mask 0) in the middle is transparent, whatever its reward/value
    adv2, ret2 = gae_unwhitened(T([[0.0, 9.0, 0.0, 1.0]]), T([[0.5, 99.0, 0.6, 0.7]]), T([[1.0, 0, 1, 1]]), gamma, lam)
    assert torch.allclose(adv2, T([[0.21712, 0.0, 0.246, 0.3]]), atol=1e-6)
    assert torch.allclose(ret2, T([[0.71712, 0.0, 0.846, 1.0]]), atol=1e-6)
    # trailing padding changes nothing
    adv3, _ = gae_unwhitened(T([[0.0, 0.0, 1.0, 5.0]]), T([[0.5, 0.6, 0.7, 3.0]]), T([[1.0, 1, 1, 0]]), gamma, lam)
    assert torch.allclose(adv3[:, :3], adv, atol=1e-6) and adv3[0, 3] == 0


def test_gae_public_whitens_and_needs_values():
    rewards, mask = outcome_batch([1.0, -1.0, 0.5], [3, 2, 1])
    values = torch.rand(3, 3)
    adv, ret = ADV_ESTIMATORS.get("gae")(AdvantageInputs(rewards, mask, values=values, gamma=0.99, lam=0.95))
    valid = adv[mask.bool()]
    assert valid.mean().item() == pytest.approx(0.0, abs=1e-6)
    assert valid.std().item() == pytest.approx(1.0, abs=1e-4)
    _, raw_ret = gae_unwhitened(rewards, values, mask, 0.99, 0.95)
    assert torch.equal(ret, raw_ret)
    with pytest.raises(UserError, match="critic"):
        ADV_ESTIMATORS.get("gae")(AdvantageInputs(rewards, mask))


def test_reinforce_plus_plus_by_hand():
    rewards, mask = T([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]]), T([[1.0, 1, 1], [1, 1, 0]])
    adv, ret = ADV_ESTIMATORS.get("reinforce_plus_plus")(AdvantageInputs(rewards, mask, gamma=0.5))
    assert torch.allclose(ret, T([[0.25, 0.5, 1.0], [1.0, 2.0, 0.0]]))
    # whitened over the 5 valid tokens: mean .95, unbiased std sqrt(.45)
    expected = [-1.043498, -0.67082, 0.074536, 0.074536, 1.565248]
    assert adv[mask.bool()].tolist() == pytest.approx(expected, abs=1e-5)
    assert adv[1, 2] == 0


def test_reinforce_plus_plus_baseline_by_hand():
    rewards, mask = outcome_batch([1.0, 0.0, 3.0], [2, 1, 2])
    adv, _ = ADV_ESTIMATORS.get("reinforce_plus_plus_baseline")(AdvantageInputs(rewards, mask, index=["a", "a", "b"]))
    # minus group mean -> .5 (2 tokens), -.5 (1 token); b alone: baseline 0 (verl) -> 3 (2 tokens); whiten over
    # those 5 tokens (mean 1.3, unbiased std 1.6047)
    expected = [-0.498542, -0.498542, -1.121719, 1.059401, 1.059401]
    assert adv[mask.bool()].tolist() == pytest.approx(expected, abs=1e-5)


def test_remax_by_hand():
    rewards, mask = T([[0.0, 0.0, 1.0], [0.0, 0.5, 0.0]]), T([[1.0, 1, 1], [1, 1, 0]])
    adv, ret = ADV_ESTIMATORS.get("remax")(AdvantageInputs(rewards, mask, reward_baselines=T([0.4, 1.0])))
    assert torch.allclose(ret, T([[1.0, 1.0, 1.0], [0.5, 0.5, 0.0]]))
    assert torch.allclose(adv, T([[0.6, 0.6, 0.6], [-0.5, -0.5, 0.0]]))
    with pytest.raises(UserError, match="reward_baselines"):
        ADV_ESTIMATORS.get("remax")(AdvantageInputs(rewards, mask))
    with pytest.raises(ValueError, match="2 rows"):
        ADV_ESTIMATORS.get("remax")(AdvantageInputs(rewards, mask, reward_baselines=T([0.4, 1.0, 0.0])))


def test_remax_per_sample_baseline_rows():
    """n samples per prompt share their prompt's greedy reward; a sample that matches it gets 0,
    better ones a positive and worse ones a negative advantage (no std division, no group mean)."""
    rewards, mask = outcome_batch([1.0, 0.0, 0.5, 0.0, 1.0, 1.0], [3, 1, 2, 2, 3, 1])
    baselines = T([0.5, 0.5, 0.5, 1.0, 1.0, 1.0])  # prompt a: greedy scored 0.5, prompt b: 1.0
    inputs = AdvantageInputs(rewards, mask, index=["a"] * 3 + ["b"] * 3, reward_baselines=baselines)
    adv, ret = ADV_ESTIMATORS.get("remax")(inputs)
    assert per_row(adv, mask) == pytest.approx([0.5, -0.5, 0.0, -1.0, 0.0, 0.0])
    assert per_row(ret, mask) == pytest.approx([1.0, 0.0, 0.5, 0.0, 1.0, 1.0])


def test_estimators_declare_their_needs():
    """The trainer and the config checks act on these declarations, never on estimator names."""
    assert needs_of(ADV_ESTIMATORS, "gae") == Needs(values=True)
    for name in ("grpo", "rloo", "reinforce_plus_plus_baseline"):  # a group of one: baseline 0 (verl), n=1 runs
        assert needs_of(ADV_ESTIMATORS, name) == Needs(), name
    assert needs_of(ADV_ESTIMATORS, "grpo_passk") == Needs(groups=True)
    assert needs_of(ADV_ESTIMATORS, "reinforce_plus_plus") == Needs()
    assert needs_of(ADV_ESTIMATORS, "remax") == Needs(greedy_baseline=True)
    with pytest.raises(UserError, match="remax"):
        needs_of(ADV_ESTIMATORS, "remaxx")


# ------------------------------------------------------------ property tests
@st.composite
def grouped_outcomes(draw):
    sizes = draw(st.lists(st.integers(1, 5), min_size=1, max_size=5))
    uids = np.array([f"u{g}" for g, n in enumerate(sizes) for _ in range(n)], dtype=object)
    perm = draw(st.permutations(range(len(uids))))  # groups need not be contiguous
    uids = uids[list(perm)]
    scores = draw(
        st.lists(st.sampled_from([0.0, 0.5, 1.0, -1.0, 2.0]) | st.floats(-3, 3), min_size=len(uids), max_size=len(uids))
    )
    lengths = draw(st.lists(st.integers(1, 4), min_size=len(uids), max_size=len(uids)))
    rewards, mask = outcome_batch(scores, lengths, width=4)
    return uids, T(scores), rewards, mask


def _groups(uids):
    return {u: [i for i, v in enumerate(uids) if v == u] for u in set(uids)}


@settings(**MAX)
@given(grouped_outcomes())
def test_grpo_zero_mean_per_group(case):
    uids, scores, rewards, mask = case
    adv, _ = ADV_ESTIMATORS.get("grpo")(AdvantageInputs(rewards, mask, index=uids))
    rows = T(per_row(adv, mask))
    for idx in _groups(uids).values():
        # float32 rounding of (r - mean) is ~1e-7 |r|, then divided by the group's std: scores that differ by
        # 1e-3 (0.9023, 0.9004, 0.9) sum to ~1e-4 instead of 0
        group = scores[idx]
        tol = 1e-5 + 1e-6 * len(idx) * float(group.abs().max()) / (float(group.std(unbiased=False)) + 1e-6)
        if len(idx) == 1:  # verl's group of one: mean 0, std 1, so the advantage is the score
            assert rows[idx[0]].item() == pytest.approx(scores[idx[0]].item() / (1 + 1e-6), abs=1e-6)
            continue
        assert rows[idx].sum().item() == pytest.approx(0.0, abs=tol)


@settings(**MAX)
@given(grouped_outcomes())
def test_dr_grpo_is_r_minus_mean_and_rloo_is_scaled(case):
    uids, scores, rewards, mask = case
    dr_grpo = AdvantageInputs(rewards, mask, index=uids, norm_adv_by_std=False)
    dr = T(per_row(ADV_ESTIMATORS.get("grpo")(dr_grpo)[0], mask))
    loo = T(per_row(ADV_ESTIMATORS.get("rloo")(AdvantageInputs(rewards, mask, index=uids))[0], mask))
    for idx in _groups(uids).values():
        n, r = len(idx), scores[idx]
        if n == 1:
            assert dr[idx].item() == pytest.approx(r.item()) and loo[idx].item() == pytest.approx(r.item())
            continue
        assert torch.allclose(dr[idx], r - r.mean(), atol=1e-5)
        assert torch.allclose(loo[idx], n / (n - 1) * (r - r.mean()), atol=1e-5)
        others = T([(r.sum() - r[j]) / (n - 1) for j in range(n)])
        assert torch.allclose(loo[idx], r - others, atol=1e-5)


@st.composite
def token_batches(draw):
    b, r = draw(st.integers(1, 4)), draw(st.integers(1, 6))
    mask = T(draw(st.lists(st.lists(st.sampled_from([0.0, 1.0]), min_size=r, max_size=r), min_size=b, max_size=b)))
    floats = st.lists(st.lists(st.floats(-2, 2), min_size=r, max_size=r), min_size=b, max_size=b)
    return T(draw(floats)), T(draw(floats)), mask


def _reference_gae(rewards, values, mask, gamma, lam):
    """Plain per-row GAE over the compressed list of valid tokens."""
    adv = torch.zeros_like(rewards)
    for i in range(rewards.shape[0]):
        pos = mask[i].nonzero().flatten().tolist()
        last, nxt = 0.0, 0.0
        for t in reversed(pos):
            delta = rewards[i, t].item() + gamma * nxt - values[i, t].item()
            last = delta + gamma * lam * last
            nxt = values[i, t].item()
            adv[i, t] = last
    return adv


@settings(**MAX)
@given(token_batches(), st.floats(0.5, 1.0), st.floats(0.0, 1.0))
def test_gae_matches_compressed_reference(batch, gamma, lam):
    rewards, values, mask = batch
    adv, ret = gae_unwhitened(rewards, values, mask, gamma, lam)
    ref = _reference_gae(rewards, values, mask, gamma, lam)
    assert torch.allclose(adv, ref, atol=1e-4)
    assert torch.allclose(ret, (ref + values) * mask, atol=1e-4)


@settings(**MAX)
@given(token_batches())
def test_gae_lam1_gamma1_zero_values_is_return_to_go(batch):
    rewards, _values, mask = batch
    rtg = torch.flip(torch.cumsum(torch.flip(rewards * mask, [1]), 1), [1]) * mask
    adv, ret = gae_unwhitened(rewards, torch.zeros_like(rewards), mask, 1.0, 1.0)
    assert torch.allclose(adv, rtg, atol=1e-5)
    assert torch.allclose(discounted_returns(rewards, mask, 1.0), rtg, atol=1e-5)
    _, public_ret = ADV_ESTIMATORS.get("gae")(AdvantageInputs(rewards, mask, values=torch.zeros_like(rewards)))
    assert torch.allclose(public_ret, rtg, atol=1e-5)
