"""The reward stage: `reward_model.reward_manager` picks a registered manager (rule by default, coevolve,
or one registered by a plugin); every manager puts a response's score on its last valid token."""

from __future__ import annotations

import pytest
import torch

from rlkit.errors import UserError
from rlkit.reward.coevolve import CoevolveReward
from rlkit.reward.manager import RewardManager
from rlkit.reward.placement import decode_responses, last_valid_index, on_last_token, response_lengths
from rlkit.reward.registry import REWARD_MANAGERS, build_reward_manager
from rlkit.trainer.run.run_config import load_config

HF = ["actor_rollout_ref.rollout.name=hf"]
COEVOLVE = ["reward_model.reward_manager=coevolve", "data.shuffle=false", "data.train_batch_size=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4"]


def test_last_valid_token_with_tool_tokens_in_between():
    # model, model, tool, tool, model, pad | nothing valid | all valid
    mask = torch.tensor([[1, 1, 0, 0, 1, 0], [0, 0, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1]])
    assert last_valid_index(mask).tolist() == [4, 0, 5]
    assert response_lengths(mask) == [5, 0, 6]
    placed = on_last_token(torch.tensor([0.5, 2.0, -1.0]), mask)
    assert placed.dtype == torch.float32
    assert placed.tolist() == [[0, 0, 0, 0, 0.5, 0], [2.0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, -1.0]]


def test_decoded_text_runs_to_the_last_valid_token():
    from rlkit.testing import build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    ids = torch.tensor([tok("#### 5 the answer")["input_ids"] + [tok.pad_token_id]])
    mask = torch.tensor([[1, 1, 0, 0, 0]])
    assert decode_responses(tok, ids, mask) == ["#### 5"]


def test_default_is_the_rule_manager_and_naive_is_its_alias():
    from rlkit.testing import build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    cfg = load_config("grpo", HF)
    assert cfg.reward_model.reward_manager == "rule"
    assert isinstance(build_reward_manager(cfg, tok), RewardManager)
    assert REWARD_MANAGERS.get("naive") is RewardManager  # verl's name for it


def test_coevolve_from_the_config():
    from rlkit.testing import build_tiny_tokenizer

    cfg = load_config("grpo", [*HF, *COEVOLVE, "reward_model.num_workers=3",
                               "reward_model.reward_kwargs={tester_reward: balanced, per_test_s: 1.5}"])
    manager = build_reward_manager(cfg, build_tiny_tokenizer())
    assert isinstance(manager, CoevolveReward) and isinstance(manager.fallback, RewardManager)
    assert manager.tester_mode == "balanced"
    assert (manager.limits.per_test_s, manager.limits.max_workers, manager.limits.tests_per_run) == (1.5, 3, 1)


@pytest.mark.parametrize("overrides, expect", [
    (["reward_model.reward_manager=rulez"], "reward_model.reward_manager='rulez' is not registered"),
    ([*COEVOLVE, "reward_model.reward_kwargs={per_test: 1}"],
     "reward_model.reward_kwargs.per_test: not an option of reward manager 'coevolve'; it accepts ['tester_reward'"),
    (["reward_model.reward_kwargs={per_test_s: 1}"], "of reward manager 'rule'; it accepts no reward_kwargs"),
    ([*COEVOLVE, "reward_model.reward_kwargs={tester_reward: strict}"], "tester_reward='strict' is not a tester"),
    ([*COEVOLVE, "data.shuffle=true"], "set data.shuffle=false and an even data.train_batch_size"),
])
def test_bad_reward_config_fails_at_load(overrides, expect):
    with pytest.raises(UserError) as exc:
        load_config("grpo", [*HF, *overrides])
    assert expect in str(exc.value)


def test_a_manager_registered_outside_rlkit_is_built_by_name():
    class Constant:
        """A batch-level manager as a plugin writes one: every response scores `value`."""

        def __init__(self, value: float) -> None:
            self.value = value

        @classmethod
        def from_config(cls, cfg, tokenizer, *, value: float = 1.0):
            return cls(value)

        def __call__(self, batch):
            from rlkit.protocol import Batch

            mask = batch["response_mask"]
            return Batch({"token_level_scores": on_last_token(torch.full((mask.shape[0],), self.value), mask)})

    REWARD_MANAGERS.register("test_constant")(Constant)
    try:
        cfg = load_config("grpo", [*HF, "reward_model.reward_manager=test_constant",
                                   "reward_model.reward_kwargs={value: 0.25}"])
        manager = build_reward_manager(cfg, None)
        from rlkit.protocol import Batch

        out = manager(Batch({"response_mask": torch.tensor([[1, 1, 0], [1, 0, 0]])}))
        assert out["token_level_scores"].tolist() == [[0, 0.25, 0], [0.25, 0, 0]]
    finally:
        REWARD_MANAGERS.unregister("test_constant")
