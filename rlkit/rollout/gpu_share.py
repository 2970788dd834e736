"""The colocated engine's `gpu_memory_utilization` fitted to what is free on its GPU when it starts.

vLLM reads the value as a fraction of the whole device and refuses to start unless that much is free. In the hybrid
engine the actor (and reference, critic) shards already sit on the same GPU when the engine starts, so verl's
default 0.5 can be more than is left: the engine then never starts. Asking for at most what is free (less a margin
for the engine's own start-up buffers) lets it start with a smaller KV cache, said in one line; too little free is
an error naming the key and the fix."""

from __future__ import annotations

import logging
import math

from rlkit.errors import UserError

KEY = "actor_rollout_ref.rollout.gpu_memory_utilization"
MARGIN = 0.02  # of the device, left free for CUDA graphs / NCCL buffers that vLLM's check does not count
MIN_SHARE = 0.05  # below this an engine holds its weights with almost no KV cache: stop instead

log = logging.getLogger(__name__)


def fit_gpu_share(requested: float, free_bytes: int, total_bytes: int) -> float:
    """`requested` when that much of the device is free, else the free fraction (rounded down, less MARGIN)."""
    free_share = math.floor(free_bytes / total_bytes * 100) / 100 - MARGIN
    if requested <= free_share:
        return requested
    if free_share < MIN_SHARE:
        raise UserError(
            f"{KEY}={requested}: only {free_bytes / 2**30:.1f} of {total_bytes / 2**30:.1f} GiB are free on the GPU "
            "when the rollout engine starts (the trainer's shards hold the rest); turn on "
            "actor_rollout_ref.actor.fsdp_config.param_offload / optimizer_offload, use more GPUs, or a smaller model"
        )
    log.warning("%s=%s: %.2f of the GPU is free when the engine starts; it asks for %.2f (a smaller KV cache)",
                KEY, requested, free_share + MARGIN, free_share)
    return free_share
