"""The actor's distillation term (ActorWorker._distill_term) in its two forms, on fixed log-probs, no model:
a direct loss (coef x the aggregated per-token loss) and a per-token advantage under the PPO loss."""

from __future__ import annotations

import math

import pytest
import torch

from rlkit.config.distillation import DistillationLossConfig
from rlkit.config.schema import ActorConfig, ModelConfig
from rlkit.protocol import Batch
from rlkit.workers.actor import ActorWorker

STUDENT = torch.tensor([[-0.5, -2.0, -0.1]])
TEACHER = torch.tensor([[-1.5, -0.2, -3.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0]])
SCORED = torch.tensor([[1.0, 1.0, 0.0]])  # the teacher scored the first two tokens only


def _term(**loss):
    cfg = DistillationLossConfig(**loss)
    actor = ActorWorker(ActorConfig(), ModelConfig(), total_steps=1, rollout_n=1, temperature=1.0, seed=0,
                        distillation=cfg)
    lp = STUDENT.clone().requires_grad_(True)
    mb = Batch({"teacher_log_probs": TEACHER, "teacher_mask": SCORED})
    metrics: dict[str, float] = {}
    loss_value = actor._distill_term(mb, lp, STUDENT.clone(), MASK, None, metrics)
    loss_value.backward()
    return float(loss_value.detach()), lp.grad[0].tolist(), metrics


def test_direct_loss_is_the_coefficient_times_the_mean_over_scored_tokens():
    value, grad, metrics = _term(loss_mode="k3", distillation_loss_coef=0.5)
    k3 = [math.exp(t - s) - (t - s) - 1 for s, t in zip([-0.5, -2.0], [-1.5, -0.2])]
    assert metrics["actor/distill_loss"] == pytest.approx(sum(k3) / 2, abs=1e-6)
    assert value == pytest.approx(0.5 * sum(k3) / 2, abs=1e-6)
    assert grad[2] == 0.0  # an unscored token gets no gradient


def test_policy_gradient_form_uses_minus_the_loss_as_advantage():
    value, grad, metrics = _term(loss_mode="k1", use_policy_gradient=True, distillation_loss_coef=2.0)
    adv = [-2.0 * (s - t) for s, t in zip([-0.5, -2.0], [-1.5, -0.2])]
    # at ratio 1 the PPO loss is -mean(adv) and its gradient with respect to each log-prob -adv / tokens
    assert value == pytest.approx(-sum(adv) / 2, abs=1e-6)
    assert grad == pytest.approx([-adv[0] / 2, -adv[1] / 2, 0.0], abs=1e-6)
    assert "actor/distill_pg_loss" in metrics
