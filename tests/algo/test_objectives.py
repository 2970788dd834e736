"""The 2025-26 objectives (issue 34) against handwritten versions of each paper's formula.

Random masked batches (hypothesis, the project's derandomized profile): per-token losses are written out
element by element, aggregated by hand, and compared with the registered entry on the loss value, the
gradient with respect to the current log-probs and the metrics each entry reports.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlkit.algo.advantages import ADV_ESTIMATORS, AdvantageInputs
from rlkit.algo.policy_loss import POLICY_LOSSES

LOW, HIGH, C, TAU_POS, TAU_NEG, BETA = 0.2, 0.28, 3.0, 1.0, 1.05, 0.1
PARAMS = dict(clip_ratio_low=LOW, clip_ratio_high=HIGH, clip_ratio_c=C, tau_pos=TAU_POS, tau_neg=TAU_NEG,
              dro_beta=BETA, clip_cov_ratio=0.0002, clip_cov_lb=1.0, clip_cov_ub=5.0, kl_cov_ratio=0.0002,
              ppo_kl_coef=0.1, vespo_k_pos=2.0, vespo_lambda_pos=3.0, vespo_k_neg=3.0, vespo_lambda_neg=2.0)
EXAMPLES = settings(max_examples=20, deadline=None)


@st.composite
def batches(draw):
    """(old, log_prob, advantages, mask): B x R, some rows empty, log-probs < 0, ratios around 1."""
    b, r, seed = draw(st.integers(1, 5)), draw(st.integers(1, 6)), draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    lp = -3.0 * torch.rand(b, r, generator=g, dtype=torch.float64) - 1e-3
    old = torch.clamp(lp + 0.4 * torch.randn(b, r, generator=g, dtype=torch.float64), max=-1e-3)
    adv = torch.randn(b, r, generator=g, dtype=torch.float64)
    lengths = torch.randint(0, r + 1, (b,), generator=g)
    lengths[0] = max(int(lengths[0]), 1)  # at least one valid token
    mask = (torch.arange(r)[None] < lengths[:, None]).double()
    return old, lp, adv, mask


def _cells(mask):
    return [(i, t) for i in range(mask.shape[0]) for t in range(mask.shape[1]) if mask[i, t] > 0]


def _token_mean(terms: dict, mask) -> torch.Tensor:
    cells = _cells(mask)
    return sum(terms[c] for c in cells) / len(cells)


def _seq_mean_token_mean(terms: dict, mask) -> torch.Tensor:
    rows = [i for i in range(mask.shape[0]) if mask[i].sum() > 0]
    per_row = [sum(terms[(i, t)] for t in range(mask.shape[1]) if mask[i, t] > 0) / mask[i].sum() for i in rows]
    return sum(per_row) / len(rows)


def _share(flags: dict, mask) -> float:
    cells = _cells(mask)
    return sum(bool(flags[c]) for c in cells) / len(cells)


def _compare(name, case, reference, mode="token-mean", **extra):
    """The entry's loss and d loss / d log_prob equal the reference's; returns the entry's output."""
    old, lp, adv, mask = case
    lp_a, lp_b = lp.clone().requires_grad_(True), lp.clone().requires_grad_(True)
    out = POLICY_LOSSES.get(name)(old, lp_a, adv, mask, **{**PARAMS, **extra}, loss_agg_mode=mode)
    ref = reference(old, lp_b, adv, mask)
    assert float(out["pg_loss"].detach()) == pytest.approx(float(ref.detach()), rel=1e-9, abs=1e-12)
    out["pg_loss"].backward()
    ref.backward()
    torch.testing.assert_close(lp_a.grad, lp_b.grad, rtol=1e-9, atol=1e-12)
    assert float(out["ppo_kl"]) == pytest.approx(_token_mean({c: old[c] - lp[c] for c in _cells(mask)}, mask))
    return out


@EXAMPLES
@given(batches())
def test_cispo(case):
    old, lp, adv, mask = case

    def ref(old, lp, adv, mask):
        terms = {}
        for c in _cells(mask):
            w = min(max(math.exp(float((lp[c] - old[c]).detach())), 1 - LOW), 1 + HIGH)  # a number: no gradient
            terms[c] = -w * adv[c] * lp[c]
        return _token_mean(terms, mask)

    out = _compare("cispo", case, ref)
    ratio = {c: math.exp(float(lp[c] - old[c])) for c in _cells(mask)}
    assert float(out["pg_clipfrac"]) == pytest.approx(_share({c: ratio[c] > 1 + HIGH for c in ratio}, mask))
    assert float(out["pg_clipfrac_lower"]) == pytest.approx(_share({c: ratio[c] < 1 - LOW for c in ratio}, mask))


@EXAMPLES
@given(batches())
def test_vespo(case):
    """TRL's VESPO: phi(w) = w^k exp(lambda (1 - w)) of the whole-sequence ratio w = prod_t r_t, detached."""
    old, lp, adv, mask = case

    def phi(c):
        i = c[0]
        log_w = sum(float(lp[i, t] - old[i, t]) for t in range(mask.shape[1]) if mask[i, t] > 0)
        log_w = min(max(log_w, math.log(1e-8)), 20.0)
        k, lam = (2.0, 3.0) if adv[c] >= 0 else (3.0, 2.0)
        return math.exp(log_w) ** k * math.exp(lam * (1 - math.exp(log_w)))

    def ref(old, lp, adv, mask):
        return _token_mean({c: -phi(c) * adv[c] * lp[c] for c in _cells(mask)}, mask)

    out = _compare("vespo", case, ref)
    assert float(out["pg_clipfrac"]) == pytest.approx(_share({c: phi(c) < 1 for c in _cells(mask)}, mask))


@EXAMPLES
@given(batches())
def test_sapo(case):
    def ref(old, lp, adv, mask):
        terms = {}
        for c in _cells(mask):
            tau = TAU_POS if adv[c] > 0 else TAU_NEG
            r = torch.exp(lp[c] - old[c])
            terms[c] = -(4 / tau) / (1 + torch.exp(-tau * (r - 1))) * adv[c]
        return _seq_mean_token_mean(terms, mask)

    _compare("sapo", case, ref, mode="seq-mean-token-mean")


@EXAMPLES
@given(batches())
def test_gpg_loss(case):
    _compare("gpg", case, lambda old, lp, adv, mask: _token_mean({c: -adv[c] * lp[c] for c in _cells(mask)}, mask))


@EXAMPLES
@given(batches())
def test_dro(case):
    def ref(old, lp, adv, mask):
        return _token_mean({c: -(adv[c] * lp[c] - BETA / 2 * (lp[c] - old[c]) ** 2) for c in _cells(mask)}, mask)

    _compare("dro", case, ref)


def _dppo_ref(keep_fn):
    def ref(old, lp, adv, mask):
        terms = {}
        for c in _cells(mask):
            p, q = math.exp(float(lp[c].detach())), math.exp(float(old[c]))
            w = min(p / q, C) if keep_fn(p, q, float(adv[c])) else 0.0
            terms[c] = -w * adv[c] * lp[c]
        return _token_mean(terms, mask)
    return ref


def _tv_keep(p, q, a):
    return p - q <= HIGH if a > 0 else q - p <= LOW


def _kl_keep(p, q, a):
    kl = q * math.log(q / p) + (1 - q) * math.log((1 - q) / (1 - p))
    return (kl <= HIGH or p <= q) if a > 0 else (kl <= LOW or p >= q)


@EXAMPLES
@given(batches())
@pytest.mark.parametrize(("name", "keep"), [("dppo_tv", _tv_keep), ("dppo_kl", _kl_keep)])
def test_dppo(name, keep, case):
    old, lp, adv, mask = case
    out = _compare(name, case, _dppo_ref(keep))
    flags = {c: not keep(math.exp(float(lp[c])), math.exp(float(old[c])), float(adv[c])) for c in _cells(mask)}
    assert float(out["pg_clipfrac"]) == pytest.approx(_share(flags, mask))


@EXAMPLES
@given(batches())
def test_geo_mean(case):
    old, lp, adv, mask = case

    def ref(old, lp, adv, mask):
        losses = []
        for i in range(mask.shape[0]):
            ts = [t for t in range(mask.shape[1]) if mask[i, t] > 0]
            if not ts:
                continue
            a_i = sum(float(adv[i, t]) for t in ts) / len(ts)
            logs = []
            for t in ts:
                lr = lp[i, t] - old[i, t]
                clipped = torch.clamp(lr, -LOW, HIGH)
                # pessimistic for the token's sign: the smaller objective sign(A) * log r
                logs.append(lr if adv[i, t] > 0 and lr < clipped or adv[i, t] < 0 and lr > clipped
                            else clipped if adv[i, t] != 0 else lr * 0)
            losses.append(-a_i * torch.exp(sum(logs) / len(ts)))
        return sum(losses) / len(losses)

    out = _compare("gmpo", case, ref, mode="seq-mean-token-mean")
    out_of_range = {c: not -LOW <= float(lp[c] - old[c]) <= HIGH for c in _cells(mask)}
    up = {c: out_of_range[c] and adv[c] > 0 for c in out_of_range}
    down = {c: out_of_range[c] and adv[c] < 0 for c in out_of_range}
    assert float(out["pg_clipfrac"]) == pytest.approx(_share(up, mask))
    assert float(out["pg_clipfrac_lower"]) == pytest.approx(_share(down, mask))


def _cov(adv, lp, mask):
    cells = _cells(mask)
    ma = sum(float(adv[c]) for c in cells) / len(cells)
    ml = sum(float(lp[c]) for c in cells) / len(cells)
    return {c: (float(adv[c]) - ma) * (float(lp[c]) - ml) for c in cells}


def _ppo_clip(r, a):
    return max(-a * r, -a * torch.clamp(r, 1 - LOW, 1 + HIGH))


@EXAMPLES
@given(batches(), st.floats(0.05, 0.5))
def test_kl_cov(case, ratio):
    old, lp, adv, mask = case
    cov = _cov(adv, lp, mask)
    k = max(int(ratio * len(cov)), 1)
    top = set(sorted(cov, key=cov.get, reverse=True)[:k])

    def ref(old, lp, adv, mask):
        terms = {}
        for c in _cells(mask):
            lr = lp[c] - old[c]
            terms[c] = -adv[c] * torch.exp(lr) + (0.1 * lr.abs() if c in top else 0.0)
        return _token_mean(terms, mask)

    out = _compare("kl_cov", case, ref, kl_cov_ratio=ratio)
    assert float(out["pg_clipfrac"]) == pytest.approx(k / len(cov))  # the covariance-selected share


@EXAMPLES
@given(batches(), st.floats(-0.3, 0.1), st.floats(0.2, 3.0))
def test_clip_cov_drops_every_candidate_when_the_ratio_allows(case, lb, ub):
    """With clip_cov_ratio = 1 every candidate (unclipped, lb < cov < ub) is drawn: the draw is deterministic."""
    old, lp, adv, mask = case
    cov = _cov(adv, lp, mask)

    def candidate(c):
        r = math.exp(float(lp[c] - old[c]))
        unclipped = -float(adv[c]) * r >= -float(adv[c]) * min(max(r, 1 - LOW), 1 + HIGH)
        return unclipped and lb < cov[c] < ub

    dropped = {c: candidate(c) for c in cov}

    def ref(old, lp, adv, mask):
        terms = {c: 0.0 * lp[c] if dropped[c] else _ppo_clip(torch.exp(lp[c] - old[c]), adv[c]) for c in _cells(mask)}
        return _token_mean(terms, mask)

    out = _compare("clip_cov", case, ref, clip_cov_ratio=1.0, clip_cov_lb=lb, clip_cov_ub=ub)
    assert float(out["pg_clipfrac"]) == pytest.approx(_share(dropped, mask))


def test_clip_cov_draws_its_ratio_of_tokens_among_candidates_only():
    g = torch.Generator().manual_seed(3)
    lp = -torch.rand(8, 50, generator=g) * 3
    adv = torch.randn(8, 50, generator=g) * 3
    mask = torch.ones(8, 50)
    out = POLICY_LOSSES.get("clip_cov")(lp, lp, adv, mask, clip_cov_ratio=0.01, clip_cov_lb=0.5, clip_cov_ub=5.0)
    assert float(out["pg_clipfrac"]) == pytest.approx(4 / 400)  # int(0.01 * 400) tokens, there are more candidates
    lp_g = lp.clone().requires_grad_(True)
    POLICY_LOSSES.get("clip_cov")(lp, lp_g, adv, mask, clip_cov_ratio=0.01, clip_cov_lb=0.5,
                                  clip_cov_ub=5.0)["pg_loss"].backward()
    no_grad = lp_g.grad == 0
    cov = (adv - adv.mean()) * (lp - lp.mean())
    assert int(no_grad.sum()) == 4 and bool(((cov > 0.5) & (cov < 5.0))[no_grad].all())


def test_dro_without_beta_names_the_key():
    from rlkit.errors import UserError

    with pytest.raises(UserError, match="policy_loss.dro_beta"):
        POLICY_LOSSES.get("dro")(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2))


# ------------------------------------------------------------------------------------------ estimators
@st.composite
def groups(draw, min_size=1):
    n_groups = draw(st.integers(1, 4))
    sizes = [draw(st.integers(min_size, 5)) for _ in range(n_groups)]
    uids = [f"p{g}" for g, s in enumerate(sizes) for _ in range(s)]
    scores = [draw(st.sampled_from([0.0, 0.5, 1.0, 2.0])) for _ in uids]
    lengths = [draw(st.integers(1, 4)) for _ in uids]
    rewards = torch.zeros(len(uids), 4)
    mask = torch.zeros(len(uids), 4)
    for i, (s, n) in enumerate(zip(scores, lengths)):
        mask[i, :n] = 1
        rewards[i, n - 1] = s
    return uids, scores, lengths, rewards, mask


def _rows(adv, mask):
    """The per-row advantage, checking it is constant over the row's valid tokens and 0 elsewhere."""
    out = []
    for i in range(adv.shape[0]):
        valid = adv[i][mask[i] > 0]
        assert torch.allclose(valid, valid[0].expand_as(valid)) and bool((adv[i][mask[i] == 0] == 0).all())
        out.append(float(valid[0]))
    return out


def _members(uids):
    return {u: [i for i, v in enumerate(uids) if v == u] for u in dict.fromkeys(uids)}


@EXAMPLES
@given(groups(), st.booleans())
def test_grpo_passk(case, by_std):
    uids, scores, _lengths, rewards, mask = case
    adv, _ = ADV_ESTIMATORS.get("grpo_passk")(AdvantageInputs(rewards, mask, index=uids, norm_adv_by_std=by_std))
    rows = _rows(adv, mask)
    for idx in _members(uids).values():
        if len(idx) == 1:
            assert rows[idx[0]] == 0
            continue
        ranked = sorted(scores[i] for i in idx)
        gap = ranked[-1] - ranked[-2]
        if by_std:
            gap /= float(torch.tensor([scores[i] for i in idx]).std()) + 1e-6
        nonzero = [i for i in idx if rows[i] != 0]
        assert len(nonzero) <= 1 and sum(rows[i] for i in idx) == pytest.approx(gap, rel=1e-5, abs=1e-6)
        assert not nonzero or scores[nonzero[0]] == ranked[-1]


@EXAMPLES
@given(groups())
def test_opo(case):
    uids, scores, lengths, rewards, mask = case
    rows = _rows(ADV_ESTIMATORS.get("opo")(AdvantageInputs(rewards, mask, index=uids))[0], mask)
    for idx in _members(uids).values():
        base = sum(lengths[i] * scores[i] for i in idx) / sum(lengths[i] for i in idx) if len(idx) > 1 else 0.0
        for i in idx:
            assert rows[i] == pytest.approx(scores[i] - base, abs=1e-6)


@EXAMPLES
@given(groups())
def test_gpg_estimator(case):
    uids, scores, _lengths, rewards, mask = case
    rows = _rows(ADV_ESTIMATORS.get("gpg")(AdvantageInputs(rewards, mask, index=uids))[0], mask)
    members = _members(uids)
    informative = sum(len(idx) for idx in members.values() if len({scores[i] for i in idx}) > 1)
    alpha = len(uids) / max(informative, 1)
    for idx in members.values():
        mean = sum(scores[i] for i in idx) / len(idx)
        for i in idx:
            assert rows[i] == pytest.approx(alpha * (scores[i] - mean) if len(idx) > 1 else 0.0, abs=1e-5)


def test_gpg_rescales_by_the_groups_that_carry_signal():
    """Group a is all equal (no gradient), group b differs: alpha = 4 rows / 2 informative = 2."""
    rewards, mask = torch.tensor([[1.0], [1.0], [0.0], [1.0]]), torch.ones(4, 1)
    adv, _ = ADV_ESTIMATORS.get("gpg")(AdvantageInputs(rewards, mask, index=["a", "a", "b", "b"]))
    assert adv.flatten().tolist() == pytest.approx([0.0, 0.0, -1.0, 1.0])


@EXAMPLES
@given(groups(), st.lists(st.sampled_from([0.0, 1.0, 3.0]), min_size=8, max_size=40), st.booleans())
def test_gdpo(case, pool, weighted):
    uids, _scores, _lengths, rewards, mask = case
    n = len(uids)
    comps = {"acc": [pool[i % len(pool)] for i in range(n)], "fmt": [pool[(3 * i + 1) % len(pool)] for i in range(n)]}
    weights = [1.0, 0.25] if weighted else None
    adv, _ = ADV_ESTIMATORS.get("gdpo")(AdvantageInputs(
        rewards, mask, index=uids, reward_components={k: torch.tensor(v) for k, v in comps.items()},
        reward_weights=weights))
    members = _members(uids)
    total = [0.0] * n
    for w, values in zip(weights or [1.0, 1.0], comps.values()):
        for idx in members.values():
            group = torch.tensor([values[i] for i in idx], dtype=torch.float64)
            for i in idx:
                total[i] += w * ((values[i] - float(group.mean())) / (float(group.std()) + 1e-6) if len(idx) > 1
                                 else 0.0)
    t = torch.tensor(total, dtype=torch.float64)
    expected = (t - t.mean()) / ((t.std() if n > 1 else torch.tensor(0.0)) + 1e-6)
    assert _rows(adv, mask) == pytest.approx(expected.tolist(), rel=1e-4, abs=1e-4)


def test_gdpo_without_components_names_the_key():
    from rlkit.errors import UserError

    with pytest.raises(UserError, match="algorithm.gdpo_reward_keys"):
        ADV_ESTIMATORS.get("gdpo")(AdvantageInputs(torch.zeros(2, 1), torch.ones(2, 1), index=["a", "a"]))
