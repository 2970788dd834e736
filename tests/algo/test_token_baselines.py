"""The optimal token baseline estimators against OTB's formula written out token by token, and their refusal."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlkit.algo.advantages import ADV_ESTIMATORS, AdvantageInputs
from rlkit.algo.needs import Needs, needs_of
from rlkit.errors import UserError
from rlkit.trainer.run.run_config import load_config

EXAMPLES = settings(max_examples=25, deadline=None)
EPS = 1e-8


@st.composite
def cases(draw):
    """(uids, rewards, mask, old_log_probs, sum_pi_squared, is_weights): groups of 1-4, masks with holes."""
    sizes = [draw(st.integers(1, 4)) for _ in range(draw(st.integers(1, 3)))]
    uids = [f"p{g}" for g, s in enumerate(sizes) for _ in range(s)]
    b, r, seed = len(uids), draw(st.integers(1, 6)), draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand(b, r, generator=g) < 0.75).double()  # holes stand for tool output
    rewards = torch.randn(b, r, generator=g, dtype=torch.float64) * mask * (torch.rand(b, r, generator=g) < 0.4)
    old = -2.0 * torch.rand(b, r, generator=g, dtype=torch.float64) - 1e-3
    # sum_v pi_v^2 lies in [pi_t^2, 1]
    pi = old.exp()
    spq = pi**2 + (1 - pi**2) * torch.rand(b, r, generator=g, dtype=torch.float64)
    weights = 0.5 + torch.rand(b, r, generator=g, dtype=torch.float64) if draw(st.booleans()) else None
    return uids, rewards, mask, old, spq, weights


def _per_row(rewards, mask, old, spq, weights, i):
    """(positions, G, W) of row i's valid tokens, from the definitions, one token at a time."""
    pos = [t for t in range(mask.shape[1]) if mask[i, t] > 0]
    g_vals, w_vals, w = [], [], 0.0
    for t in pos:
        step = 1 - 2 * float(old[i, t].exp()) + float(spq[i, t])
        w += step * (float(weights[i, t]) ** 2 if weights is not None else 1.0)
        w_vals.append(w)
        g_vals.append(sum(float(rewards[i, u]) for u in pos if u >= t))
    return pos, g_vals, w_vals


def _expected(case, by_model_token):
    uids, rewards, mask, old, spq, weights = case
    rows = {i: _per_row(rewards, mask, old, spq, weights, i) for i in range(len(uids))}
    adv = torch.zeros_like(rewards)
    for i, (pos, g_i, _w) in rows.items():
        if by_model_token:  # the k-th model token of every non-empty sample of the group
            peers = [j for j in range(len(uids)) if uids[j] == uids[i] and rows[j][0]]
            keys = list(range(len(pos)))
            cell = {j: dict(enumerate(zip(rows[j][1], rows[j][2]))) for j in peers}
        else:  # the same column of every sample of the group
            peers = [j for j in range(len(uids)) if uids[j] == uids[i]]
            keys = pos
            cell = {j: dict(zip(rows[j][0], zip(rows[j][1], rows[j][2]))) for j in peers}
        for k, t, g in zip(keys, pos, g_i):
            if len(peers) == 1:
                adv[i, t] = g
                continue
            present = [cell[j][k] for j in peers if k in cell[j]]
            base = sum(gj * wj for gj, wj in present) / (sum(wj for _, wj in present) + EPS)
            adv[i, t] = g - base
    return adv


@EXAMPLES
@given(cases(), st.sampled_from(["optimal_token_baseline", "tir_optimal_token_baseline"]))
def test_otb_against_the_formula(case, name):
    uids, rewards, mask, old, spq, weights = case
    adv, ret = ADV_ESTIMATORS.get(name)(AdvantageInputs(
        rewards, mask, index=uids, old_log_probs=old, sum_pi_squared=spq, rollout_is_weights=weights))
    expected = _expected(case, by_model_token=name.startswith("tir"))
    assert torch.allclose(adv, expected, rtol=1e-6, atol=1e-6)
    assert (adv[mask == 0] == 0).all()
    assert torch.allclose(ret[:, 0], (rewards * mask).sum(-1))  # return-to-go from the first column


def test_tir_aligns_model_tokens_across_a_tool_span():
    """Two samples of three model tokens, the second with a tool span after its first: TIR compares step k with
    step k (equal energies: the baseline is the plain mean), by column the lone column-1 token is its own baseline."""
    rewards = torch.tensor([[0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 1, 1]], dtype=torch.float64)
    common = dict(index=["a", "a"], old_log_probs=torch.full_like(rewards, -1.0),
                  sum_pi_squared=torch.full_like(rewards, 0.5))
    tir, _ = ADV_ESTIMATORS.get("tir_optimal_token_baseline")(AdvantageInputs(rewards, mask, **common))
    assert torch.allclose(tir, 0.5 * torch.tensor([[1, 1, 1, 0], [-1, 0, -1, -1]], dtype=torch.float64))
    col, _ = ADV_ESTIMATORS.get("optimal_token_baseline")(AdvantageInputs(rewards, mask, **common))
    assert abs(float(col[0, 1])) < 1e-6 and abs(float(col[0, 0]) - 0.5) < 1e-6


def test_otb_needs_and_config():
    """Both declare sum_pi_squared; a run with them loads (the actor computes it), bypass_mode (which skips that
    forward) is refused with one line, and verl's switch for it is accepted with a notice."""
    for name in ("optimal_token_baseline", "tir_optimal_token_baseline"):
        assert needs_of(ADV_ESTIMATORS, name) == Needs(groups=True, sum_pi_squared=True)
        with pytest.raises(UserError, match="needs old_log_probs and sum_pi_squared.*AdvantageInputs"):
            ADV_ESTIMATORS.get(name)(AdvantageInputs(torch.zeros(2, 1), torch.ones(2, 1), index=["a", "a"]))
        assert load_config("grpo", [f"algorithm.adv_estimator={name}"]).algorithm.adv_estimator == name
    with pytest.raises(UserError, match="optimal_token_baseline needs sum_v pi_v.*bypass_mode=true skips.*"
                                        "bypass_mode=false"):
        load_config("grpo", ["algorithm.adv_estimator=optimal_token_baseline", "algorithm.bypass_mode=true",
                             "actor_rollout_ref.rollout.calculate_log_probs=true"])
    notices: list[str] = []
    load_config("grpo", ["algorithm.adv_estimator=optimal_token_baseline",
                         "actor_rollout_ref.actor.calculate_sum_pi_squared=true",
                         "actor_rollout_ref.actor.sum_pi_squared_checkpointing=true"], notices=notices)
    assert len([n for n in notices if "calculate_sum_pi_squared=true -> nothing to set" in n]) == 1
    assert len([n for n in notices if "sum_pi_squared_checkpointing=true -> nothing to set" in n]) == 1
