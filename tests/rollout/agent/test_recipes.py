"""The agent / code recipes: their YAML loads against the schema, their scripts parse."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from rlkit.trainer.run.run_config import load_config

RECIPES = Path(__file__).resolve().parents[3] / "recipes"


@pytest.mark.parametrize("name", ["gsm8k_calculator_multiturn", "code_rl", "coevolve_code"])
def test_recipe_config_loads(name):
    cfg = load_config("grpo", ["actor_rollout_ref.rollout.name=hf"], str(RECIPES / f"{name}.yaml"))
    assert cfg.data.max_prompt_length + cfg.data.max_response_length <= 1024
    if name == "gsm8k_calculator_multiturn":
        assert cfg.actor_rollout_ref.rollout.multi_turn.enable
        assert cfg.actor_rollout_ref.rollout.multi_turn.tools == ["calculator"]
    if name == "coevolve_code":  # run by `rlkit train` itself: the recipe only names the reward manager
        assert not cfg.data.shuffle and cfg.data.train_batch_size % 2 == 0
        assert cfg.reward_model.reward_manager == "coevolve"
        assert cfg.reward_model.reward_kwargs["tester_reward"] == "gated"


@pytest.mark.parametrize("script", ["gsm8k_calculator_multiturn.sh", "code_rl.sh", "coevolve_code.sh"])
def test_recipe_script_parses(script):
    subprocess.run(["bash", "-n", str(RECIPES / script)], check=True)


def test_multi_turn_is_in_the_config_reference():
    text = (RECIPES.parent / "docs" / "config.md").read_text()
    for key in ("enable", "max_turns", "tools", "max_parallel_tools", "format"):
        assert f"`actor_rollout_ref.rollout.multi_turn.{key}`" in text
