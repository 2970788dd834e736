"""Short GRPO runs on the code set with the tiny model (HF rollout, Ray, 2 steps): plain one-shot
generation, and multi-turn with the calculator. Nothing may crash; the metrics must be logged."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from rlkit_cli.main import app

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def code_run_dir(tmp_path_factory):
    from rlkit.testing import save_tiny_model

    root = tmp_path_factory.mktemp("code_grpo")
    result = CliRunner().invoke(app, ["data", "code", "--out", str(root)])
    assert result.exit_code == 0, result.output
    model = save_tiny_model(root / "model")
    config = json.loads((model / "config.json").read_text())
    config["max_position_embeddings"] = 512  # prompt (with the tool schemas) + a multi-turn response
    (model / "config.json").write_text(json.dumps(config))
    return root


class ListTracker:
    def __init__(self):
        self.steps: list[dict] = []

    def log(self, metrics, step):
        self.steps.append(dict(metrics, _step=step))


def overrides(root, name, *extra):
    return [
        f"data.train_files={root}/train.parquet", f"data.val_files={root}/test.parquet",
        "data.max_prompt_length=256", "data.max_response_length=64", "data.train_batch_size=2",
        "data.truncation=filter", "data.val_max_samples=2",
        f"actor_rollout_ref.model.path={root}/model", "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", "actor_rollout_ref.rollout.calculate_log_probs=true",
        "trainer.total_training_steps=2", "trainer.n_gpus_per_node=1", "trainer.device=cpu",
        "trainer.val_before_train=false", "trainer.save_freq=-1", "trainer.resume_mode=disable",
        f"trainer.default_local_dir={root}/{name}", "reward_model.num_workers=2", *extra,
    ]  # fmt: skip


def run(root, name, *extra):
    from rlkit.trainer.run.run_config import load_config
    from rlkit.trainer.step.rl_trainer import RLTrainer

    cfg = load_config("grpo", overrides(root, name, *extra))
    trainer = RLTrainer(cfg)
    trainer.tracker = ListTracker()
    try:
        summary = trainer.fit()
    finally:
        trainer.workers.shutdown()
    return summary, trainer.tracker.steps


def check_common(steps):
    assert [s["_step"] for s in steps] == [1, 2]
    for s in steps:
        for key in ("critic/score/mean", "actor/pg_loss", "response_length/mean", "timing_s/gen",
                    "perf/rollout_tokens_per_s", "reward/rlkit/code/score/mean"):
            assert key in s and math.isfinite(s[key]), key
    assert "val/rlkit/code/score/mean@1" in steps[-1]


def test_grpo_code_one_shot(code_run_dir, ray_local):
    summary, steps = run(code_run_dir, "plain")
    assert summary.steps == 2
    check_common(steps)
    assert "num_turns/mean" not in steps[0]


def test_grpo_code_multi_turn_calculator(code_run_dir, ray_local):
    summary, steps = run(
        code_run_dir, "agent",
        "actor_rollout_ref.rollout.multi_turn.enable=true", "actor_rollout_ref.rollout.multi_turn.tools=[calculator]",
        "actor_rollout_ref.rollout.multi_turn.max_turns=3",
        # a simulated user that answers once: episodes with user tokens (response_mask 0) between model turns
        "actor_rollout_ref.rollout.multi_turn.interaction=fixed_reply",
    )  # fmt: skip
    assert summary.steps == 2
    check_common(steps)
    for s in steps:
        for key in ("num_turns/mean", "num_turns/max", "tool_calls/mean", "tool_errors/sum",
                    "agent/in_flight/max", "agent/batch_size/mean", "timing_s/agent_loop"):
            assert key in s and math.isfinite(s[key]), key
        assert s["num_turns/mean"] >= 1 and s["agent/in_flight/max"] == 4
    assert max(s["num_turns/max"] for s in steps) >= 2, "some episode had a second turn (interleaved mask)"


def test_coevolve_recipe_two_steps(code_run_dir, ray_local, tmp_path):
    """recipes/coevolve_code.yaml through `rlkit train`: GRPO with the `coevolve` reward manager on paired
    coder/tester rows (the recipe's reward_model.reward_manager and reward_kwargs, nothing else)."""
    from pathlib import Path

    result = CliRunner().invoke(app, ["data", "code", "--coevolve", "--out", str(tmp_path / "cv")])
    assert result.exit_code == 0, result.output
    recipe = Path(__file__).resolve().parents[3] / "recipes" / "coevolve_code.yaml"
    args = overrides(code_run_dir, "coevolve", "data.val_batch_size=4", "reward_model.reward_kwargs.per_test_s=1",
                     f"trainer.log_dir={tmp_path / 'logs'}", "trainer.logger=[file]", "trainer.cpus_per_worker=1")
    args = [a.replace(f"{code_run_dir}/train.parquet", f"{tmp_path}/cv/train.parquet")
            .replace(f"{code_run_dir}/test.parquet", f"{tmp_path}/cv/test.parquet") for a in args]
    result = CliRunner().invoke(app, ["train", "grpo", "--config", str(recipe), *args])
    assert result.exit_code == 0, result.output
    rows = [json.loads(x) for x in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "coevolve/coder_reward/mean" in json.dumps(r)]
    assert len(steps) == 2
    flat = json.dumps(steps[-1])
    for key in ("coevolve/tester_reward/mean", "coevolve/valid_test/frac", "coevolve/sandbox_runs",
                "val/rlkit/code_tester/score/mean@1"):
        assert key in flat, key
