"""A plugin that makes a step hang the way runs hang: at step HANG_STEP, rank 1 enters an all-reduce that rank 0
never joins (rank 0 sleeps instead). The policy loss is the vanilla one otherwise. tests/trainer/test_hang.py
trains with it (`trainer.plugins=[tests.trainer.hang_plugin]`) and a short trainer.hang_timeout_s."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from rlkit.algo import POLICY_LOSSES
from rlkit.debug.breakpoints import current_step

LOSS = "test_hang_at_step"
HANG_STEP = 2


@POLICY_LOSSES.register(LOSS)
def hang_at_step(old_log_prob, log_prob, advantages, response_mask, **kwargs):
    if current_step() == HANG_STEP:
        if dist.get_rank() == 1:
            dist.all_reduce(torch.zeros(1))  # waits for rank 0, which never comes
        else:
            never_join()
    return POLICY_LOSSES.get("vanilla")(old_log_prob, log_prob, advantages, response_mask, **kwargs)


def never_join() -> None:
    """Rank 0's side of the hang: it never reaches the all-reduce."""
    while True:
        time.sleep(1)


def unregister() -> None:
    POLICY_LOSSES.unregister(LOSS)
