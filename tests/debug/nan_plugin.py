"""A plugin policy loss whose gradient turns NaN at step 3 on rank 1 (a finite loss: the check must find the NaN in
the gradients and name the parameter); tests/debug/test_debug_nan.py trains with it under `--debug nan`."""

from __future__ import annotations

import torch

from rlkit.algo import POLICY_LOSSES
from rlkit.algo.policy_loss import vanilla
from rlkit.debug import current_rank, current_step
from tests.debug.nan_case import LOSS, RANK, STEP


@POLICY_LOSSES.register(LOSS)
def nan_grad_at_step_3(old_log_prob, log_prob, advantages, response_mask, **kwargs):
    """PPO's clipped loss; at step 3 on rank 1 plus sqrt(0 * log_prob): 0 forward, NaN backward (inf * 0)."""
    out = vanilla(old_log_prob, log_prob, advantages, response_mask, **kwargs)
    if current_step() == STEP and current_rank() == RANK:
        out["pg_loss"] = out["pg_loss"] + torch.sqrt((log_prob * 0).sum())
    return out
