"""`algorithm.rollout_is_batch_normalize`: the mean of the truncated importance weights over the whole training batch
(every data-parallel rank's rows), which the actor's loss divides them by, as verl normalises them (mean 1)."""

from __future__ import annotations

import torch.distributed as dist

from rlkit.algo.rollout_correction import RolloutCorrection, is_scale_of
from rlkit.controller.worker import collective_device
from rlkit.protocol import Batch


def batch_is_scale(correction: RolloutCorrection | None, batch: Batch) -> float:
    """The divisor of this update's IS weights: 1 unless `batch_normalize`; one all_reduce over the ranks."""
    if correction is None or not correction.batch_normalize:
        return 1.0
    if "old_log_probs" not in batch or "rollout_log_probs" not in batch:
        raise RuntimeError("algorithm.rollout_is_batch_normalize needs old_log_probs and rollout_log_probs in the "
                           "update batch (finalize sets actor.recompute_old_log_prob=true for it)")
    sums = correction.batch_sums(batch["old_log_probs"], batch["rollout_log_probs"], batch["response_mask"])
    sums = sums.double()
    if dist.is_initialized() and dist.get_world_size() > 1:
        sums = sums.to(collective_device())
        dist.all_reduce(sums)
    return is_scale_of(sums.cpu())
