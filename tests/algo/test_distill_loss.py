"""The distillation losses (rlkit/algo/distill_loss.py) against their formulas, written out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from rlkit.algo.distill_loss import DISTILL_LOSSES, DistillInputs, distill_loss

STUDENT = [-0.5, -2.0, -0.1]
TEACHER = [-1.5, -0.2, -0.1]


def _inputs() -> DistillInputs:
    return DistillInputs(torch.tensor([STUDENT]), torch.tensor([TEACHER]))


@pytest.mark.parametrize(("name", "formula"), [
    ("k1", lambda s, t: s - t),
    ("abs", lambda s, t: abs(s - t)),
    ("mse", lambda s, t: 0.5 * (s - t) ** 2),
    ("k2", lambda s, t: 0.5 * (s - t) ** 2),
    ("k3", lambda s, t: math.exp(t - s) - (t - s) - 1),
    ("low_var_kl", lambda s, t: math.exp(t - s) - (t - s) - 1),
])
def test_reverse_kl_estimators_match_their_formula(name, formula):
    got = distill_loss(name, _inputs())[0].tolist()
    want = [formula(s, t) for s, t in zip(STUDENT, TEACHER)]
    assert got == pytest.approx(want, abs=1e-6)


def test_clamps_raise_log_probs_and_cap_the_loss():
    got = distill_loss("k1", DistillInputs(torch.tensor([[-30.0, -1.0]]), torch.tensor([[-2.0, -25.0]])),
                       log_prob_min=-10.0, loss_max=5.0)[0].tolist()
    # (-10) - (-2) = -8 (student raised to -10); (-1) - (-10) = 9, capped at 5
    assert got == pytest.approx([-8.0, 5.0])


def test_forward_kl_topk_matches_its_formula():
    t = torch.log(torch.tensor([[[0.6, 0.3]]]))
    s = torch.log(torch.tensor([[[0.2, 0.5]]]))
    got = float(distill_loss("forward_kl_topk", DistillInputs(torch.zeros(1, 1), torch.zeros(1, 1), s, t)))
    assert got == pytest.approx(0.6 * math.log(0.6 / 0.2) + 0.3 * math.log(0.3 / 0.5), abs=1e-6)
    assert DISTILL_LOSSES.get("forward_kl_topk").topk and not DISTILL_LOSSES.get("k3").topk


def test_forward_kl_topk_over_the_whole_vocabulary_is_the_full_forward_kl():
    gen = torch.Generator().manual_seed(0)
    vocab = 11
    teacher = torch.log_softmax(torch.randn(2, 3, vocab, generator=gen) * 2, -1)
    student = torch.log_softmax(torch.randn(2, 3, vocab, generator=gen), -1)
    top = teacher.topk(vocab, dim=-1)  # what the teacher role returns with topk = vocab
    x = DistillInputs(torch.zeros(2, 3), torch.zeros(2, 3), student.gather(-1, top.indices), top.values)
    full = torch.nn.functional.kl_div(student, teacher, log_target=True, reduction="none").sum(-1)
    assert torch.allclose(distill_loss("forward_kl_topk", x), full, atol=1e-6)
    # fewer ids: only the teacher's most likely tokens count (not renormalised), so not the full KL
    k = 3
    part = DistillInputs(x.student_log_probs, x.teacher_log_probs, student.gather(-1, top.indices[..., :k]),
                         top.values[..., :k])
    assert not torch.allclose(distill_loss("forward_kl_topk", part), full)
