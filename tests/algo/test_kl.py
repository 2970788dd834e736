import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlkit.algo.kl import (
    KL_CONTROLLERS,
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    kl_penalty,
    make_kl_controller,
)
from rlkit.errors import UserError

T = torch.tensor
LOGP = T([0.0, -1.0, -2.0])
REF = T([-1.0, -1.0, 0.0])  # logp - ref = [1, 0, -2]


@pytest.mark.parametrize(
    "name, expected",
    [
        ("k1", [1.0, 0.0, -2.0]),
        ("kl", [1.0, 0.0, -2.0]),
        ("abs", [1.0, 0.0, 2.0]),
        ("k2", [0.5, 0.0, 2.0]),
        ("mse", [0.5, 0.0, 2.0]),
        # exp(ref - logp) - (ref - logp) - 1 with ref - logp = [-1, 0, 2]
        ("k3", [math.exp(-1), 0.0, math.exp(2) - 3]),
        ("low_var_kl", [math.exp(-1), 0.0, math.exp(2) - 3]),
    ],
)
def test_estimators_by_hand(name, expected):
    assert kl_penalty(LOGP, REF, name).tolist() == pytest.approx(expected, abs=1e-6)


def test_registry_names_and_k3_clamp():
    assert KL_ESTIMATORS.names() == ["abs", "k1", "k2", "k3", "kl", "low_var_kl", "mse"]
    assert kl_penalty(T([0.0]), T([50.0]), "k3").item() == 10.0
    with pytest.raises(UserError, match="k3"):
        kl_penalty(LOGP, REF, "k4")


@settings(max_examples=40, deadline=None)
@given(st.floats(-5, 5), st.floats(-5, 5))
def test_k2_k3_non_negative(a, b):
    for name in ("k2", "k3", "abs"):
        assert kl_penalty(T([a]), T([b]), name).item() >= 0


def test_apply_kl_penalty_by_hand():
    scores = T([[0.0, 0.0, 1.0]])
    ctrl = FixedKLController(0.1)
    rewards, metrics = apply_kl_penalty(scores, LOGP[None], REF[None], T([[1.0, 1.0, 0.0]]), ctrl, "k1")
    # kl * mask = [1, 0, 0]; reward -= 0.1 * kl; the masked token keeps its score
    assert torch.allclose(rewards, T([[-0.1, 0.0, 1.0]]))
    assert metrics == pytest.approx({"actor/reward_kl_penalty": 0.5, "actor/reward_kl_penalty_coeff": 0.1})
    assert ctrl.value == 0.1


def test_apply_kl_penalty_updates_adaptive_controller():
    ctrl = AdaptiveKLController(0.2, target_kl=0.1, horizon=100)
    _, metrics = apply_kl_penalty(torch.zeros(4, 3), torch.zeros(4, 3), -torch.ones(4, 3), torch.ones(4, 3), ctrl)
    # kl = 1 >> target: error clipped to .2, n_steps = 4 rows -> x(1 + .2 * 4/100)
    assert metrics["actor/reward_kl_penalty_coeff"] == pytest.approx(0.2)
    assert ctrl.value == pytest.approx(0.2 * 1.008)


def test_adaptive_controller_by_hand():
    ctrl = AdaptiveKLController(init_kl_coef=0.2, target_kl=0.1, horizon=100)
    ctrl.update(current_kl=0.15, n_steps=10)  # error .5 -> clipped .2 -> x1.02
    assert ctrl.value == pytest.approx(0.204)
    ctrl.update(current_kl=0.09, n_steps=10)  # error -.1 -> x0.99
    assert ctrl.value == pytest.approx(0.204 * 0.99)
    before = ctrl.value
    ctrl.update(current_kl=0.1, n_steps=10)
    assert ctrl.value == pytest.approx(before)
    with pytest.raises(ValueError, match="target_kl"):
        AdaptiveKLController(0.1, target_kl=0.0, horizon=10)


@settings(max_examples=40, deadline=None)
@given(st.floats(0.0, 10.0), st.integers(1, 1000))
def test_adaptive_moves_toward_target(kl, steps):
    ctrl = AdaptiveKLController(1.0, target_kl=0.5, horizon=1000)
    ctrl.update(kl, steps)
    if kl > 0.5:
        assert ctrl.value > 1.0
    elif kl < 0.5:
        assert ctrl.value < 1.0
    assert 0.8 - 1e-9 <= ctrl.value <= 1.2 + 1e-9  # at most 20% per horizon


def test_factory():
    assert KL_CONTROLLERS.names() == ["adaptive", "fixed"]
    fixed = make_kl_controller("fixed", kl_coef=0.05)
    fixed.update(100.0, 1000)
    assert isinstance(fixed, FixedKLController) and fixed.value == 0.05
    adaptive = make_kl_controller(type="adaptive", kl_coef=0.05, target_kl=0.2, horizon=50)
    assert isinstance(adaptive, AdaptiveKLController)
    assert (adaptive.value, adaptive.target, adaptive.horizon) == (0.05, 0.2, 50)
    with pytest.raises(UserError, match="adaptive"):
        make_kl_controller("adaptiv")


def test_k3_is_never_negative_near_zero():
    """Found by the property test: exp(x) - x - 1 rounds below 0 in float32 for tiny x (e.g. 1e-6)."""
    x = torch.linspace(-1e-3, 1e-3, 20001)
    assert float(kl_penalty(torch.zeros_like(x), x, "k3").min()) >= 0
