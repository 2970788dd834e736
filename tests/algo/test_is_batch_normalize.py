"""algorithm.rollout_correction.rollout_is_batch_normalize (verl): the truncated importance weights are divided by
their mean over the batch (over tokens at the token level, over rows at a row level), so they average 1."""

from __future__ import annotations

import pytest
import torch

from rlkit.algo.rollout_correction import RolloutCorrection, is_scale_of
from rlkit.config.schema import AlgorithmConfig
from rlkit.protocol import Batch
from rlkit.trainer.run.run_config import load_config
from rlkit.workers.is_batch_norm import batch_is_scale

HF = ["actor_rollout_ref.rollout.name=hf"]


def _logps():
    old = torch.log(torch.tensor([[1.0, 2.0, 0.5], [4.0, 1.0, 1.0]]) * 0.1)
    rollout = torch.log(torch.full((2, 3), 0.1))
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    return old, rollout, mask


def test_token_level_weights_average_one_over_the_valid_tokens():
    old, rollout, mask = _logps()  # token ratios 1, 2, 0.5 | 4 (truncated to 3), 1
    corr = RolloutCorrection(is_level="token", is_threshold=3.0, batch_normalize=True)
    scale = is_scale_of(corr.batch_sums(old, rollout, mask))
    assert scale == pytest.approx((1 + 2 + 0.5 + 3 + 1) / 5)
    w = corr(old, rollout, mask, is_scale=scale).weights
    assert float(w[mask > 0].mean()) == pytest.approx(1.0)
    assert float(w[1, 2]) == 0.0
    plain = RolloutCorrection(is_level="token", is_threshold=3.0)(old, rollout, mask).weights
    assert torch.allclose(w, plain / scale)


def test_sequence_level_averages_one_weight_per_row():
    old, rollout, mask = _logps()  # row ratios 1 and 4 (truncated to 10: kept)
    corr = RolloutCorrection(is_level="sequence", is_threshold=10.0, batch_normalize=True)
    assert is_scale_of(corr.batch_sums(old, rollout, mask)) == pytest.approx((1.0 + 4.0) / 2)


def test_the_update_batch_gives_the_scale_and_the_config_reads_verls_key():
    old, rollout, mask = _logps()
    corr = RolloutCorrection.from_config(AlgorithmConfig(rollout_is="token", rollout_is_threshold=3.0,
                                                         rollout_is_batch_normalize=True))
    batch = Batch({"old_log_probs": old, "rollout_log_probs": rollout, "response_mask": mask})
    assert batch_is_scale(corr, batch) == pytest.approx(1.5)
    assert batch_is_scale(RolloutCorrection(is_level="token"), batch) == 1.0  # off: no scaling
    cfg = load_config("grpo", HF + ["actor_rollout_ref.rollout.calculate_log_probs=true",
                                    "algorithm.rollout_correction.rollout_is=token",
                                    "algorithm.rollout_correction.rollout_is_batch_normalize=true"])
    assert cfg.algorithm.rollout_is_batch_normalize is True
    assert cfg.actor_rollout_ref.actor.recompute_old_log_prob is True  # the batch mean needs pi_old before the update
