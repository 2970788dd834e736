"""PF-PPO (verl's algorithm.use_pf_ppo): the batch is resampled with replacement by weights from the rows' scores,
after the GAE advantages; the config reads verl's keys and refuses it where verl would do nothing."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlkit.algo.pf_ppo import REWEIGHTS, pf_ppo_indices, pf_ppo_resample
from rlkit.config.schema import RLConfig
from rlkit.errors import UserError
from rlkit.protocol import Batch
from rlkit.trainer.run.run_config import load_config
from rlkit.trainer.step.advantage_stage import compute_advantages

HF = ["actor_rollout_ref.rollout.name=hf"]


def test_the_weights_of_each_method():
    s = torch.tensor([-2.0, 0.0, 1.0, 3.0])
    assert torch.equal(REWEIGHTS.get("pow")(s, 2.0), torch.tensor([4.0, 0.0, 1.0, 9.0]))
    assert torch.equal(REWEIGHTS.get("max_min")(s, 2.0), torch.tensor([1.0, 0.0, 0.0, 1.0]))
    assert torch.allclose(REWEIGHTS.get("max_random")(s, 2.0), torch.tensor([0.1, 0.1, 0.1, 0.4]))


def test_rows_are_drawn_in_proportion_to_their_weight():
    scores = torch.tensor([0.0, 1.0, 2.0])  # pow 2: weights 0, 1, 4
    gen = torch.Generator().manual_seed(0)
    counts = torch.zeros(3)
    for _ in range(200):
        counts += torch.bincount(pf_ppo_indices(scores, "pow", 2.0, gen), minlength=3)
    assert counts[0] == 0 and 0.15 < counts[1] / counts.sum() < 0.25  # 1/5 expected
    uniform = torch.cat([pf_ppo_indices(torch.zeros(4), "pow", 2.0, gen) for _ in range(10)])
    assert uniform.unique().numel() == 4  # all-zero scores: drawn uniformly, not only row 0


def test_resample_moves_whole_rows_tensors_and_non_tensors_together():
    scores = torch.zeros(4, 3)
    scores[2, -1] = 5.0  # only row 2 has weight (pow): every draw is row 2
    batch = Batch({"token_level_scores": scores, "advantages": torch.arange(12.0).reshape(4, 3)},
                  {"uid": np.array(["a", "b", "c", "d"], dtype=object)})
    metrics = pf_ppo_resample(batch, "pow", 2.0)
    assert len(batch) == 4 and list(batch["uid"]) == ["c"] * 4
    assert torch.equal(batch["advantages"], torch.tensor([[6.0, 7.0, 8.0]] * 4))
    assert metrics["pf_ppo/unique_rows_frac"] == 0.25


def test_the_advantage_stage_resamples_after_gae():
    cfg = RLConfig()
    cfg.algorithm.adv_estimator, cfg.algorithm.use_pf_ppo = "gae", True
    cfg.algorithm.pf_ppo.reweight_method = "max_min"
    rewards = torch.zeros(3, 2)
    rewards[0, -1], rewards[1, -1], rewards[2, -1] = 1.0, 0.5, 0.0
    batch = Batch({"token_level_scores": rewards, "token_level_rewards": rewards.clone(),
                   "response_mask": torch.ones(3, 2), "values": torch.zeros(3, 2)},
                  {"uid": np.array(["x", "y", "z"], dtype=object)})
    compute_advantages(batch, cfg)
    assert "y" not in list(batch["uid"])  # the middle score has weight 0 under max_min
    by_uid = {"x": 1.0, "z": 0.0}  # GAE's returns (values 0, gamma = lam = 1) moved with their rows
    assert [float(r) for r in batch["returns"][:, -1]] == [by_uid[u] for u in batch["uid"]]


def test_verls_keys_are_read_and_a_non_gae_run_is_one_line():
    cfg = load_config(None, HF + ["algorithm.use_pf_ppo=true", "algorithm.pf_ppo.reweight_method=max_random",
                                  "algorithm.pf_ppo.weight_pow=3"])
    assert cfg.algorithm.use_pf_ppo and cfg.algorithm.pf_ppo.reweight_method == "max_random"
    assert cfg.algorithm.pf_ppo.weight_pow == 3
    with pytest.raises(UserError, match="only with adv_estimator=gae"):
        load_config("grpo", HF + ["algorithm.use_pf_ppo=true"])
