"""verl's micro-batch keys settle in `finalize` (rlkit/config/micro_batch_sizes.py): nulls follow the actor, global
sizes become per-worker rows (divided over the workers, floor), both spellings at once is an error naming both,
and the actor role gets the old-log-prob pass's micro-batching from the rollout section."""

from __future__ import annotations

import copy

import pytest

from rlkit.config.micro_batch_sizes import settle_micro_batches
from rlkit.errors import UserError
from rlkit.trainer.run.roles import actor_role
from rlkit.trainer.run.run_config import load_config
from rlkit.workers.micro_batch import MicroBatching

HF = ["actor_rollout_ref.rollout.name=hf"]
A, R, REF = "actor_rollout_ref.actor.", "actor_rollout_ref.rollout.", "actor_rollout_ref.ref."


def test_nulls_follow_the_actor_and_own_values_win():
    cfg = load_config("ppo", HF + [A + "use_dynamic_bsz=true", A + "ppo_max_token_len_per_gpu=3000",
                                   A + "ppo_micro_batch_size_per_gpu=6", REF + "log_prob_use_dynamic_bsz=false",
                                   "critic.ppo_max_token_len_per_gpu=5000", "critic.ppo_micro_batch_size_per_gpu=3"])
    arr, critic = cfg.actor_rollout_ref, cfg.critic
    rollout, ref = arr.rollout, arr.ref
    assert (rollout.log_prob_micro_batch_size_per_gpu, rollout.log_prob_use_dynamic_bsz,
            rollout.log_prob_max_token_len_per_gpu) == (6, True, 3000)
    assert (ref.log_prob_micro_batch_size_per_gpu, ref.log_prob_use_dynamic_bsz,
            ref.log_prob_max_token_len_per_gpu) == (8, False, 3000)
    assert critic.use_dynamic_bsz is True
    assert (critic.forward_micro_batch_size_per_gpu, critic.forward_max_token_len_per_gpu) == (3, 5000)

    plain = load_config("ppo", HF)
    assert plain.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu == 4
    assert plain.critic.ppo_max_token_len_per_gpu == 32768 and plain.critic.use_dynamic_bsz is False
    assert plain.actor_rollout_ref.rollout.log_prob_use_dynamic_bsz is False

    micro = actor_role(cfg, "/model", total_steps=1).kwargs["log_prob"]
    assert micro == MicroBatching(6, use_dynamic_bsz=True, max_token_len=3000)


def test_global_sizes_are_divided_over_the_workers():
    cfg = load_config("ppo", HF + ["trainer.n_gpus_per_node=4", A + "ppo_micro_batch_size=16",
                                   R + "log_prob_micro_batch_size=32", REF + "log_prob_micro_batch_size=6",
                                   "critic.ppo_micro_batch_size=8"])
    arr, critic = cfg.actor_rollout_ref, cfg.critic
    assert arr.actor.ppo_micro_batch_size_per_gpu == 4
    assert arr.rollout.log_prob_micro_batch_size_per_gpu == 8
    assert arr.ref.log_prob_micro_batch_size_per_gpu == 1  # 6 // 4, verl's floor
    assert critic.ppo_micro_batch_size_per_gpu == critic.forward_micro_batch_size_per_gpu == 2  # forward follows
    assert [arr.actor.ppo_micro_batch_size, arr.rollout.log_prob_micro_batch_size, critic.ppo_micro_batch_size] == [
        None, None, None]  # translated, so cleared
    again = copy.deepcopy(cfg)
    settle_micro_batches(again)  # a printed (finalized) config settles to itself
    assert again == cfg

    cfg = load_config("ppo", HF + ["trainer.n_gpus_per_node=4", "critic.forward_micro_batch_size=16"])
    assert (cfg.critic.ppo_micro_batch_size_per_gpu, cfg.critic.forward_micro_batch_size_per_gpu) == (4, 4)
    with pytest.raises(UserError, match=r"actor_rollout_ref.actor.ppo_micro_batch_size=2 is less than one row per "
                                        r"worker over the 4 workers"):
        load_config("ppo", HF + ["trainer.n_gpus_per_node=4", A + "ppo_micro_batch_size=2"])


@pytest.mark.parametrize("section, key", [
    ("actor_rollout_ref.actor", "ppo_micro_batch_size"),
    ("actor_rollout_ref.rollout", "log_prob_micro_batch_size"),
    ("actor_rollout_ref.ref", "log_prob_micro_batch_size"),
    ("critic", "ppo_micro_batch_size"),
    ("critic", "forward_micro_batch_size"),
])
def test_global_and_per_gpu_together_is_an_error_naming_both(section, key):
    with pytest.raises(UserError) as info:
        load_config("ppo", HF + [f"{section}.{key}=8", f"{section}.{key}_per_gpu=2"])
    assert f"{section}.{key}=8 and {section}.{key}_per_gpu=2 are both set" in str(info.value)
    assert f"delete {key}" in str(info.value)
