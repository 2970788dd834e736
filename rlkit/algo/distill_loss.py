"""Per-token distillation losses (`distillation.distillation_loss.loss_mode`, registry `DISTILL_LOSSES`).

Every loss reads a `DistillInputs` and returns a (B, R) per-token loss; the caller aggregates it with the
actor's loss-aggregation mode over the tokens the teacher scored. The reverse-KL estimators compare the
student's and the teacher's log-prob of the token the student sampled (KL(student || teacher), estimated on the
student's own samples); `forward_kl_topk` reads the teacher's top-k log-probs per position and the student's
log-probs of the same token ids: sum_k p_t(k) (log p_t(k) - log p_s(k)), the teacher's probabilities not
renormalised over the k ids, so with k = the vocabulary it is the full KL(teacher || student).

Clamps (`clamped`): `log_prob_min_clamp` raises every log-prob to at least that value before the loss (a token one
model finds near-impossible would otherwise dominate); `loss_max_clamp` caps each token's loss.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from rlkit.algo.kl import abs_kl, k1, k2, k3
from rlkit.registry import Registry


@dataclass
class DistillInputs:
    """The student's log-probs (with grad when trained) and the teacher's, for one micro-batch."""

    student_log_probs: torch.Tensor  # (B, R) log p_s of the sampled tokens
    teacher_log_probs: torch.Tensor  # (B, R) log p_t of the same tokens
    student_topk_log_probs: torch.Tensor | None = None  # (B, R, K) log p_s at the teacher's top-k ids
    teacher_topk_log_probs: torch.Tensor | None = None  # (B, R, K) the teacher's top-k log-probs


@dataclass(frozen=True)
class DistillLoss:
    """A registered loss: its function, and whether it reads the top-k tensors (the teacher then returns them)."""

    fn: Callable[[DistillInputs], torch.Tensor]
    topk: bool = False

    def __call__(self, x: DistillInputs) -> torch.Tensor:
        return self.fn(x)


DISTILL_LOSSES: Registry[DistillLoss] = Registry("distillation loss (distillation.distillation_loss.loss_mode)")


def _reverse(estimator: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> DistillLoss:
    return DistillLoss(lambda x: estimator(x.student_log_probs, x.teacher_log_probs))


DISTILL_LOSSES.register("k1")(_reverse(k1))
DISTILL_LOSSES.register("k3", "low_var_kl")(_reverse(k3))
DISTILL_LOSSES.register("abs")(_reverse(abs_kl))
DISTILL_LOSSES.register("mse", "k2")(_reverse(k2))


def _forward_kl_topk(x: DistillInputs) -> torch.Tensor:
    if x.teacher_topk_log_probs is None or x.student_topk_log_probs is None:
        raise RuntimeError("forward_kl_topk needs the teacher's top-k log-probs and the student's at those ids")
    t, s = x.teacher_topk_log_probs, x.student_topk_log_probs
    return (t.exp() * (t - s)).sum(-1)


DISTILL_LOSSES.add("forward_kl_topk", DistillLoss(_forward_kl_topk, topk=True))


def clamped(x: DistillInputs, log_prob_min: float | None) -> DistillInputs:
    """Every log-prob of `x` raised to at least `log_prob_min` (None: `x` as it is)."""
    if log_prob_min is None:
        return x

    def c(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.clamp(min=log_prob_min)

    return DistillInputs(c(x.student_log_probs), c(x.teacher_log_probs), c(x.student_topk_log_probs),
                         c(x.teacher_topk_log_probs))


def distill_loss(name: str, x: DistillInputs, log_prob_min: float | None = None,
                 loss_max: float | None = None) -> torch.Tensor:
    """The per-token loss `name` on `x`, with the clamps (see the module docstring)."""
    loss = DISTILL_LOSSES.get(name)(clamped(x, log_prob_min))
    return loss.clamp(max=loss_max) if loss_max is not None else loss
