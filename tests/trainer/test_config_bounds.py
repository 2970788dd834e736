"""Out-of-range single values (negative lr, zero/negative batch sizes...) fail at start-up naming key and value."""

from __future__ import annotations

import pytest

from rlkit.config.bounds import BOUNDS, lookup
from rlkit.config.schema import RLConfig
from rlkit.errors import UserError
from rlkit.trainer.run.run_config import load_config
from tests.trainer.conftest import run_cli

HF = ["actor_rollout_ref.rollout.name=hf"]


@pytest.mark.parametrize(
    "override, expect",
    [
        ("actor_rollout_ref.actor.optim.lr=-1e-6", "actor_rollout_ref.actor.optim.lr=-1e-06 must be >= 0"),
        ("critic.optim.lr=-0.1", "critic.optim.lr=-0.1 must be >= 0"),
        ("data.train_batch_size=0", "data.train_batch_size=0 must be >= 1"),
        ("data.train_batch_size=-8", "data.train_batch_size=-8 must be >= 1"),
        ("data.val_batch_size=0", "data.val_batch_size=0 must be >= 1 (or null)"),
        ("actor_rollout_ref.actor.ppo_mini_batch_size=0", "actor_rollout_ref.actor.ppo_mini_batch_size=0 must be >= 1"),
        ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=-2",
         "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=-2 must be >= 1"),
        ("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=0",
         "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=0 must be >= 1"),
        ("critic.ppo_micro_batch_size_per_gpu=0", "critic.ppo_micro_batch_size_per_gpu=0 must be >= 1"),
        ("data.max_prompt_length=0", "data.max_prompt_length=0 must be >= 1"),
        ("trainer.max_actor_ckpt_to_keep=0", "trainer.max_actor_ckpt_to_keep=0 must be >= 1 (or null)"),
        ("actor_rollout_ref.actor.grad_clip=0", "actor_rollout_ref.actor.grad_clip=0.0 must be > 0"),
        ("reward_model.timeout_s=0", "reward_model.timeout_s=0.0 must be > 0"),
        ("actor_rollout_ref.actor.optim.lr=nan", "actor_rollout_ref.actor.optim.lr=nan must be >= 0"),
    ],
)
def test_out_of_range_values_name_key_and_value(override, expect):
    with pytest.raises(UserError) as info:
        load_config("grpo", HF + [override])
    assert expect in str(info.value)


def test_defaults_and_nulls_pass_and_every_key_exists():
    cfg = load_config("grpo", HF + ["data.val_batch_size=null", "trainer.total_training_steps=null",
                                    "actor_rollout_ref.actor.optim.lr=0"])
    assert cfg.actor_rollout_ref.actor.optim.lr == 0
    for key in BOUNDS:  # a renamed schema key must not leave a dead bound behind
        lookup(RLConfig(), key)


def test_cli_exit_1_one_line_no_traceback():
    res = run_cli("train", "grpo", "--dry-run", *HF, "actor_rollout_ref.actor.optim.lr=-3e-4")
    assert res.returncode == 1
    out = res.stdout + res.stderr
    assert "actor_rollout_ref.actor.optim.lr=-0.0003 must be >= 0" in " ".join(out.split())
    assert "Traceback" not in out
