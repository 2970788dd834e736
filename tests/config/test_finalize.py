"""finalize: mode fix-ups happen there (so --dry-run shows them), removed keys say so, the config layer imports
no other rlkit layer (what it cannot know arrives as hooks)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from rlkit.config import compose_config, finalize
from rlkit.config.schema import REMOVED_KEYS
from rlkit.errors import UserError
from rlkit.trainer.run.run_config import load_config

HF = ["actor_rollout_ref.rollout.name=hf"]
OFF = ["trainer.one_step_off_policy=true"]
CONFIG_DIR = Path(__file__).resolve().parents[2] / "rlkit" / "config"


def test_one_step_off_policy_is_settled_by_finalize():
    cfg = load_config("grpo", HF + OFF)
    rollout = cfg.actor_rollout_ref.rollout
    assert rollout.calculate_log_probs and cfg.algorithm.rollout_is  # the off-policy correction
    assert rollout.free_cache_engine is False  # the engine has its processes to itself
    colocated = load_config("grpo", HF)
    assert colocated.actor_rollout_ref.rollout.free_cache_engine and not colocated.algorithm.rollout_is
    with pytest.raises(UserError, match="does not support algorithm.filter_groups"):
        load_config("dapo", HF + OFF)


@pytest.mark.parametrize("key", sorted(REMOVED_KEYS))
def test_removed_keys_say_what_to_do(key, tmp_path):
    with pytest.raises(UserError) as info:
        compose_config("grpo", HF + [f"{key}=1"])
    msg = str(info.value)
    assert f"config key '{key}' (from command line" in msg and "was removed" in msg and "delete it" in msg
    top, *rest = key.split(".")
    path = tmp_path / "run.yaml"
    path.write_text(f"{top}:\n" + "".join("  " * (i + 1) + f"{p}:" + ("\n" if i < len(rest) - 1 else " 1\n")
                                         for i, p in enumerate(rest)))
    with pytest.raises(UserError, match=f"config key '{key}' \\(from {path}\\) was removed"):
        compose_config("grpo", HF, str(path))


def test_hooks_fill_what_the_config_layer_cannot_know():
    """Without hooks nothing outside rlkit.config runs; with them the launcher's facts land in the config."""
    seen = []
    cfg = finalize(compose_config("ppo", HF), [lambda c: seen.append(c.critic.enable)])
    assert seen == [True] and cfg.actor_rollout_ref.rollout.prompt_length == cfg.data.max_prompt_length
    cfg = load_config("grpo", ["trainer.debug.break_at=actor.update_policy"])
    assert cfg.actor_rollout_ref.rollout.name in ("hf", "vllm")  # the rollout package's default backend
    assert cfg.trainer.debug.break_at == ["actor.update_policy"] and cfg.critic.enable is False


def test_config_layer_imports_only_errors_and_registry():
    for path in CONFIG_DIR.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            for name in names:
                if name.startswith("rlkit"):
                    assert name.startswith(("rlkit.config", "rlkit.errors", "rlkit.registry")), (path, name)
    code = "import sys, rlkit.config; print(sorted(m for m in sys.modules if m.startswith('rlkit')))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert all(m == "rlkit" or m.startswith(("rlkit.config", "rlkit.errors")) for m in eval(loaded)), loaded


def test_verl_data_and_warmup_keys_settle_in_finalize():
    """-1 and null both mean every row; data.seed=null is rlkit's seed 1; gen_batch_size=null is the batch size."""
    cfg = load_config("grpo", HF + ["data.train_max_samples=-1", "data.val_max_samples=-1"])
    assert cfg.data.train_max_samples is None and cfg.data.val_max_samples is None
    assert cfg.data.seed == 1 and cfg.data.gen_batch_size == cfg.data.train_batch_size
    assert load_config("grpo", HF + ["data.train_max_samples=8"]).data.train_max_samples == 8
    for bad in ("data.train_max_samples=0", "data.val_max_samples=-2"):
        with pytest.raises(UserError, match=r"must be >= 1, or -1 / null for all"):
            load_config("grpo", HF + [bad])
    with pytest.raises(UserError, match="trainer.critic_warmup=-1 must be >= 0"):
        load_config("ppo", HF + ["trainer.critic_warmup=-1"])
    with pytest.raises(UserError, match="trainer.critic_warmup=2: with trainer.fully_async"):
        load_config("ppo", HF + ["trainer.fully_async=true", "trainer.critic_warmup=2"])
    assert load_config("ppo", HF + OFF + ["trainer.critic_warmup=2"]).trainer.critic_warmup == 2


def test_readers_of_the_raw_chat_need_return_raw_chat():
    no_chat = HF + ["data.return_raw_chat=false"]
    assert load_config("grpo", no_chat).data.return_raw_chat is False
    with pytest.raises(UserError, match="multi_turn.enable .* needs data.return_raw_chat=true"):
        load_config("grpo", no_chat + ["actor_rollout_ref.rollout.multi_turn.enable=true"])
    with pytest.raises(UserError, match="style=judge .* needs data.return_raw_chat=true"):
        load_config("grpo", no_chat + ["reward_model.enable=true", "reward_model.style=judge",
                                       "reward_model.judge.base_url=http://127.0.0.1:1/v1",
                                       "reward_model.judge.model=judge"])
