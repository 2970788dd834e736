"""Preference losses over (chosen, rejected) pairs, looked up by `dpo.loss_type` (TRL's names and meanings).

Every loss is a function of one number per pair, the DPO logit

    z = (log pi(chosen) - log pi(rejected)) - (log ref(chosen) - log ref(rejected))

where log pi(y) sums the completion's token log-probs (IPO averages them: `length_normalized`).
A `PreferenceLoss.fn(z, beta, label_smoothing)` returns the per-pair loss (B,); `preference_loss`
turns token log-probs into z, applies the registered loss, mixes in the SFT term (`rpo_alpha`: the
NLL of the chosen completions) and returns the metrics under TRL's names (`rewards/chosen`, ...).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rlkit.algo.utils import masked_mean, masked_sum
from rlkit.registry import Registry

PairLoss = Callable[[torch.Tensor, float, float], torch.Tensor]


@dataclass(frozen=True)
class PreferenceLoss:
    """A pair loss and how it reads a completion's log-prob (sum over tokens, or mean with `length_normalized`)."""

    fn: PairLoss
    length_normalized: bool = False


#: name -> PreferenceLoss; `dpo.loss_type` picks one.
PREFERENCE_LOSSES: Registry[PreferenceLoss] = Registry("preference loss")


def _sigmoid(z: torch.Tensor, beta: float, label_smoothing: float) -> torch.Tensor:
    """DPO's Bradley-Terry log-likelihood; label_smoothing > 0 is conservative DPO (labels flipped with that rate)."""
    return -F.logsigmoid(beta * z) * (1 - label_smoothing) - F.logsigmoid(-beta * z) * label_smoothing


def _robust(z: torch.Tensor, beta: float, label_smoothing: float) -> torch.Tensor:
    """Robust DPO: an unbiased loss under preference noise of rate label_smoothing (< 0.5)."""
    if not 0 <= label_smoothing < 0.5:
        raise ValueError(f"robust DPO needs 0 <= label_smoothing < 0.5, got {label_smoothing}")
    noisy = -F.logsigmoid(beta * z) * (1 - label_smoothing) + F.logsigmoid(-beta * z) * label_smoothing
    return noisy / (1 - 2 * label_smoothing)


def _hinge(z: torch.Tensor, beta: float, label_smoothing: float) -> torch.Tensor:
    """SLiC/RSO hinge on the scaled logit; 1/beta is the margin."""
    return torch.relu(1 - beta * z)


def _ipo(z: torch.Tensor, beta: float, label_smoothing: float) -> torch.Tensor:
    """IPO: regress the (length-averaged) logit onto 1/(2 beta) instead of pushing it to infinity."""
    return (z - 1 / (2 * beta)) ** 2


PREFERENCE_LOSSES.add("sigmoid", PreferenceLoss(_sigmoid))
PREFERENCE_LOSSES.add("robust", PreferenceLoss(_robust))
PREFERENCE_LOSSES.add("hinge", PreferenceLoss(_hinge))
PREFERENCE_LOSSES.add("ipo", PreferenceLoss(_ipo, length_normalized=True))


def sequence_logps(token_logps: torch.Tensor, mask: torch.Tensor, length_normalized: bool) -> torch.Tensor:
    """(B, R) token log-probs -> (B,) completion log-probs: the masked sum, or the masked mean."""
    return masked_mean(token_logps, mask, dim=-1) if length_normalized else masked_sum(token_logps, mask, dim=-1)


def reference_logps(token_logps: torch.Tensor, mask: torch.Tensor, loss_type: str) -> torch.Tensor:
    """The reference's completion log-probs (B,) as `loss_type` reads them; (B,) values are taken as already reduced.
    All a loss needs of the reference, so a precomputed reference stores these, not its token log-probs."""
    if token_logps.dim() == 1:
        return token_logps
    kind = PREFERENCE_LOSSES.get(loss_type)
    return sequence_logps(token_logps, mask.to(token_logps.dtype), kind.length_normalized)


def preference_loss(
    chosen_logps: torch.Tensor,
    rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    chosen_mask: torch.Tensor,
    rejected_mask: torch.Tensor,
    *,
    loss_type: str = "sigmoid",
    beta: float = 0.1,
    label_smoothing: float = 0.0,
    rpo_alpha: float | None = None,
) -> dict[str, torch.Tensor]:
    """Mean pair loss (+ rpo_alpha x NLL of the chosen tokens) and TRL's metrics, all from (B, R) token log-probs.

    The reference's may instead be (B,) completion log-probs already reduced by `reference_logps` (the
    precomputed reference, dpo.ref.precompute): every loss reads the reference through that one number per side.
    `loss` carries the gradient (through the policy's log-probs only); the other entries are detached scalars.
    """
    kind = PREFERENCE_LOSSES.get(loss_type)
    chosen_mask, rejected_mask = chosen_mask.to(chosen_logps.dtype), rejected_mask.to(rejected_logps.dtype)
    pi_c = sequence_logps(chosen_logps, chosen_mask, kind.length_normalized)
    pi_r = sequence_logps(rejected_logps, rejected_mask, kind.length_normalized)
    ref_c = reference_logps(ref_chosen_logps.detach(), chosen_mask, loss_type)
    ref_r = reference_logps(ref_rejected_logps.detach(), rejected_mask, loss_type)
    z = (pi_c - pi_r) - (ref_c - ref_r)
    loss = kind.fn(z, beta, label_smoothing).mean()
    nll = -masked_mean(chosen_logps, chosen_mask)  # token mean over every chosen completion of the batch
    if rpo_alpha is not None:
        loss = loss + rpo_alpha * nll
    chosen_rewards = beta * (pi_c - ref_c).detach()
    rejected_rewards = beta * (pi_r - ref_r).detach()
    return {
        "loss": loss,
        "rewards/chosen": chosen_rewards.mean(),
        "rewards/rejected": rejected_rewards.mean(),
        "rewards/accuracies": (chosen_rewards > rejected_rewards).float().mean(),
        "rewards/margins": (chosen_rewards - rejected_rewards).mean(),
        "logps/chosen": pi_c.detach().mean(),
        "logps/rejected": pi_r.detach().mean(),
        "nll_loss": nll.detach(),
    }
