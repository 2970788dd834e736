import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlkit.algo.preference_loss import PREFERENCE_LOSSES, preference_loss

T = torch.tensor


def log_sigmoid(x: float) -> float:
    return -math.log1p(math.exp(-x)) if x >= 0 else x - math.log1p(math.exp(x))


def sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


# the handwritten losses of one pair's logit z, and their derivative d loss / d z
BY_HAND = {
    "sigmoid": (lambda z, b, ls: -(1 - ls) * log_sigmoid(b * z) - ls * log_sigmoid(-b * z),
                lambda z, b, ls: -(1 - ls) * b * sigmoid(-b * z) + ls * b * sigmoid(b * z)),
    "robust": (lambda z, b, ls: (-(1 - ls) * log_sigmoid(b * z) + ls * log_sigmoid(-b * z)) / (1 - 2 * ls),
               lambda z, b, ls: (-(1 - ls) * b * sigmoid(-b * z) - ls * b * sigmoid(b * z)) / (1 - 2 * ls)),
    "hinge": (lambda z, b, ls: max(0.0, 1 - b * z), lambda z, b, ls: -b if 1 - b * z > 0 else 0.0),
    "ipo": (lambda z, b, ls: (z - 1 / (2 * b)) ** 2, lambda z, b, ls: 2 * (z - 1 / (2 * b))),
}

# two pairs, completions of 3 and 2 tokens (chosen) and 2 and 3 tokens (rejected); last column padding
CHOSEN_MASK = T([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
REJECTED_MASK = T([[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0]])

logp = st.floats(-6.0, -0.01, allow_nan=False)
table = st.lists(logp, min_size=8, max_size=8)


def token_tensor(values: list[float]) -> torch.Tensor:
    return T(values).reshape(2, 4)


def seq(values: torch.Tensor, mask: torch.Tensor, mean: bool) -> list[float]:
    total = [sum(v for v, m in zip(row, mrow) if m) for row, mrow in zip(values.tolist(), mask.tolist())]
    return [t / sum(mrow) for t, mrow in zip(total, mask.tolist())] if mean else total


def test_registry_names():
    assert PREFERENCE_LOSSES.names() == ["hinge", "ipo", "robust", "sigmoid"]
    assert PREFERENCE_LOSSES.get("ipo").length_normalized
    assert not PREFERENCE_LOSSES.get("sigmoid").length_normalized


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(sorted(BY_HAND)), table, table, table, table, st.floats(0.05, 2.0),
       st.sampled_from([0.0, 0.1, 0.3]), st.sampled_from([None, 0.5]))
def test_loss_and_gradient_equal_the_formula(loss_type, c, r, rc, rr, beta, smoothing, rpo_alpha):
    chosen = token_tensor(c).requires_grad_(True)
    rejected = token_tensor(r).requires_grad_(True)
    ref_c, ref_r = token_tensor(rc), token_tensor(rr)
    out = preference_loss(chosen, rejected, ref_c, ref_r, CHOSEN_MASK, REJECTED_MASK, loss_type=loss_type,
                          beta=beta, label_smoothing=smoothing, rpo_alpha=rpo_alpha)
    mean = loss_type == "ipo"  # IPO averages the completion's token log-probs
    pc, pr = seq(chosen.detach(), CHOSEN_MASK, mean), seq(rejected.detach(), REJECTED_MASK, mean)
    qc, qr = seq(ref_c, CHOSEN_MASK, mean), seq(ref_r, REJECTED_MASK, mean)
    zs = [(pc[i] - pr[i]) - (qc[i] - qr[i]) for i in range(2)]
    f, df = BY_HAND[loss_type]
    chosen_tokens = [v for v, m in zip(c, CHOSEN_MASK.flatten().tolist()) if m]
    nll = -sum(chosen_tokens) / len(chosen_tokens)
    expected = sum(f(z, beta, smoothing) for z in zs) / 2 + (rpo_alpha or 0.0) * nll
    assert out["loss"].item() == pytest.approx(expected, rel=1e-4, abs=1e-5)
    assert out["nll_loss"].item() == pytest.approx(nll, rel=1e-5)

    out["loss"].backward()
    for i in range(2):  # d loss / d token logp = d loss / dz * dz / d token (+ the NLL term on chosen tokens)
        scale = 1 / CHOSEN_MASK[i].sum().item() if mean else 1.0
        for j in range(4):
            grad_c = df(zs[i], beta, smoothing) / 2 * scale * CHOSEN_MASK[i, j].item()
            grad_c -= (rpo_alpha or 0.0) * CHOSEN_MASK[i, j].item() / len(chosen_tokens)
            assert chosen.grad[i, j].item() == pytest.approx(grad_c, rel=1e-3, abs=1e-5)
            scale_r = 1 / REJECTED_MASK[i].sum().item() if mean else 1.0
            grad_r = -df(zs[i], beta, smoothing) / 2 * scale_r * REJECTED_MASK[i, j].item()
            assert rejected.grad[i, j].item() == pytest.approx(grad_r, rel=1e-3, abs=1e-5)

    rewards_c = [beta * (pc[i] - qc[i]) for i in range(2)]
    rewards_r = [beta * (pr[i] - qr[i]) for i in range(2)]
    assert out["rewards/chosen"].item() == pytest.approx(sum(rewards_c) / 2, rel=1e-4, abs=1e-5)
    assert out["rewards/rejected"].item() == pytest.approx(sum(rewards_r) / 2, rel=1e-4, abs=1e-5)
    assert out["rewards/margins"].item() == pytest.approx((sum(rewards_c) - sum(rewards_r)) / 2, rel=1e-4, abs=1e-5)
    assert out["rewards/accuracies"].item() == sum(a > b for a, b in zip(rewards_c, rewards_r)) / 2
    assert out["logps/chosen"].item() == pytest.approx(sum(pc) / 2, rel=1e-5)
    assert out["logps/rejected"].item() == pytest.approx(sum(pr) / 2, rel=1e-5)


def test_reference_gets_no_gradient_and_equal_models_give_log2():
    """At the start of training (policy = reference) every pair's logit is 0: sigmoid DPO is log 2, accuracy 0."""
    tokens = T([[-1.0, -2.0, -0.5, -9.0], [-0.1, -0.2, -0.3, -9.0]])
    ref = tokens.clone().requires_grad_(True)
    out = preference_loss(tokens, tokens, ref, ref, CHOSEN_MASK, REJECTED_MASK)
    assert out["loss"].item() == pytest.approx(math.log(2))
    assert out["rewards/accuracies"].item() == 0.0
    assert not out["loss"].requires_grad


def test_robust_refuses_half_smoothing_and_unknown_name():
    args = (torch.zeros(2, 4),) * 4 + (CHOSEN_MASK, REJECTED_MASK)
    with pytest.raises(ValueError, match="label_smoothing < 0.5"):
        preference_loss(*args, loss_type="robust", label_smoothing=0.5)
    with pytest.raises(Exception, match="sigmoid"):
        preference_loss(*args, loss_type="sigmoidd")


@pytest.mark.parametrize("loss_type", sorted(BY_HAND))
def test_a_reduced_reference_gives_the_same_numbers(loss_type):
    """dpo.ref.precompute keeps `reference_logps` (one number per completion): every loss reads the same values."""
    from rlkit.algo.preference_loss import reference_logps

    gen = torch.Generator().manual_seed(0)
    pi_c, pi_r, ref_c, ref_r = (-torch.rand(2, 4, generator=gen) * 3 for _ in range(4))
    kwargs = {"loss_type": loss_type, "beta": 0.5, "label_smoothing": 0.1, "rpo_alpha": 0.3}
    tokens = preference_loss(pi_c, pi_r, ref_c, ref_r, CHOSEN_MASK, REJECTED_MASK, **kwargs)
    reduced = preference_loss(pi_c, pi_r, reference_logps(ref_c, CHOSEN_MASK, loss_type),
                              reference_logps(ref_r, REJECTED_MASK, loss_type), CHOSEN_MASK, REJECTED_MASK, **kwargs)
    assert {k: float(v) for k, v in tokens.items()} == {k: float(v) for k, v in reduced.items()}
