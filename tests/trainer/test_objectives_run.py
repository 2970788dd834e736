"""The issue-34 objectives' wiring: GDPO's reward components and the TRL aliases, without Ray.

Each objective's loss is unit-tested in tests/algo/; that each one trains the toy copy task end to end through the
real loop (a run per entry, 1.5-3 min each here) is bench/objectives.py's work (table + JSON in
bench/results/objectives.json; docs/algorithms.md has the numbers), outside the suite's time budget.
"""

from __future__ import annotations

import pytest
import torch

from rlkit.protocol import Batch


def test_gdpo_reads_the_reward_components_the_manager_returned():
    """The advantage stage hands gdpo the `reward_extra/<name>` columns named by algorithm.gdpo_reward_keys."""
    from rlkit.config.schema import RLConfig
    from rlkit.errors import UserError
    from rlkit.trainer.step.advantage_stage import compute_advantages

    cfg = RLConfig()
    cfg.algorithm.adv_estimator = "gdpo"
    cfg.algorithm.gdpo_reward_keys = ["acc", "fmt"]
    cfg.algorithm.gdpo_reward_weights = [1.0, 0.5]
    mask = torch.ones(4, 2)
    batch = Batch({"token_level_rewards": torch.zeros(4, 2), "response_mask": mask})
    batch["uid"] = ["a", "a", "b", "b"]
    batch["reward_extra/acc"] = [1.0, 0.0, 0.0, 0.0]
    with pytest.raises(UserError, match="reward_extra/fmt"):
        compute_advantages(batch, cfg)
    batch["reward_extra/fmt"] = [0.0, 0.0, 1.0, 0.0]
    compute_advantages(batch, cfg)
    adv = batch["advantages"][:, 0]
    # group a differs in acc only (weight 1), group b in fmt only (weight 0.5): the acc winner leads
    assert adv[0] > adv[2] > adv[3] and adv[0] > adv[1]
    assert float(adv.mean()) == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize(("loss_type", "expect"), [
    ("dapo", {"policy_loss": "vanilla", "loss_agg_mode": "token-mean", "clip_ratio_high": 0.28}),
    ("luspo", {"policy_loss": "gspo", "loss_agg_mode": "seq-mean-token-sum"}),
    ("vespo", {"policy_loss": "vespo", "loss_agg_mode": "token-mean"}),
])
def test_trl_loss_type_sets_its_objective_with_one_notice(loss_type, expect):
    from rlkit.trainer.run.run_config import load_config

    notices: list[str] = []
    cfg = load_config("grpo", [f"actor_rollout_ref.actor.loss_type={loss_type}"], notices=notices)
    for key, value in expect.items():
        assert getattr(cfg.actor_rollout_ref.actor, key) == value, key
    assert len([n for n in notices if "loss_type" in n]) == 1


def test_trl_loss_type_outside_trls_list_is_refused():
    from rlkit.errors import UserError
    from rlkit.trainer.run.run_config import load_config

    with pytest.raises(UserError, match="loss_type=vespa.*not one of TRL's loss types.*vespo"):
        load_config("grpo", ["actor_rollout_ref.actor.loss_type=vespa"])


def test_verl_policy_loss_keys_reach_the_actor_section():
    from rlkit.trainer.run.run_config import load_config

    cfg = load_config("grpo", ["actor_rollout_ref.actor.policy_loss.loss_mode=kl_cov",
                               "actor_rollout_ref.actor.policy_loss.kl_cov_ratio=0.01",
                               "actor_rollout_ref.actor.policy_loss.ppo_kl_coef=0.5",
                               "actor_rollout_ref.actor.tau_neg=2.0"])
    actor = cfg.actor_rollout_ref.actor
    assert (actor.policy_loss, actor.kl_cov_ratio, actor.ppo_kl_coef, actor.tau_neg) == ("kl_cov", 0.01, 0.5, 2.0)
