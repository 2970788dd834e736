"""Where the reward model runs: one more colocated role by default, a worker group of its own with
`reward_model.enable_resource_pool`, no worker for the judge; and a run on the separate group (training and
validation both score with it)."""

from __future__ import annotations

import pytest

from rlkit.trainer.run.run_config import load_config
from rlkit.trainer.run.run_plan import plan_layout
from tests.trainer.conftest import fit, toy_overrides, train_rows
from tests.trainer.test_reward_model_learning import save_target_rm

BASE = ["data.train_files=x.parquet", "reward_model.model.path=RM"]


def test_plan_layout_places_the_reward_model():
    off = plan_layout(load_config("grpo", BASE))
    assert [g.roles for g in off.groups] == [["actor", "rollout"]]
    colocated = plan_layout(load_config("grpo", [*BASE, "reward_model.enable=true"]))
    assert [g.roles for g in colocated.groups] == [["actor", "rollout", "reward_model"]]
    own = plan_layout(
        load_config(
            "grpo",
            [
                *BASE,
                "reward_model.enable=true",
                "reward_model.enable_resource_pool=true",
                "reward_model.n_gpus_per_node=2",
                "reward_model.cpus_per_worker=0.5",
            ],
        )
    )
    assert [(g.name, g.roles, g.per_node, g.cpus_per_process) for g in own.groups] == [
        ("rlkit", ["actor", "rollout"], 1, 1.0),
        ("rlkit-reward", ["reward_model"], 2, 0.5),
    ]
    judge = plan_layout(
        load_config(
            "grpo",
            [
                "data.train_files=x.parquet",
                "reward_model.enable=true",
                "reward_model.style=judge",
                "reward_model.judge.base_url=http://h/v1",
                "reward_model.judge.model=m",
            ],
        )
    )
    assert [g.roles for g in judge.groups] == [["actor", "rollout"]]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_reward_model_on_its_own_group(toy_data, tiny_model, tmp_path):
    rm = save_target_rm(tmp_path / "rm")
    overrides = toy_overrides(
        toy_data,
        tiny_model,
        tmp_path,
        trainer__total_training_steps=2,
        data__val_files=toy_data / "test.parquet",
        data__val_max_samples=16,
        trainer__val_before_train=True,
        reward_model__enable=True,
        reward_model__model__path=rm,
        reward_model__enable_resource_pool=True,
    ) + ["+reward_model.mix={rule: 1.0, rm: 0.5}"]
    summary, rows, _ = fit("grpo", overrides, tmp_path / "logs")
    steps = train_rows(rows)
    assert summary.steps == 2 and len(steps) == 2
    for key in ("reward/rule/mean", "reward/rm/mean", "timing_s/compute_rm_score"):
        assert key in steps[-1], key
    s = steps[-1]
    assert s["critic/score/mean"] == pytest.approx(s["reward/rule/mean"] + 0.5 * s["reward/rm/mean"], abs=1e-4)
    assert "val/rlkit/toy_copy/score/mean@1" in summary.first_val
    assert "val/reward/rm/mean" in summary.first_val and "val/reward/rule/mean" in summary.first_val


def test_recipes_load_and_the_plan_shows_the_reward():
    from pathlib import Path

    from rlkit.trainer.kinds.rl_launch import plan as resource_plan

    recipes = Path(__file__).resolve().parents[2] / "recipes"
    cpu = load_config("grpo", [], str(recipes / "rm_cpu_smollm2.yaml"))
    assert cpu.reward_model.enable and cpu.reward_model.model.input_tokenizer == cpu.actor_rollout_ref.model.path
    assert [g.roles for g in plan_layout(cpu).groups][0][-1] == "reward_model"
    gpu = load_config("grpo", [], str(recipes / "rm_gpu_llama8b.yaml"))
    assert gpu.reward_model.model.fsdp_config.param_offload and gpu.reward_model.mix == {"rule": 0.0, "rm": 1.0}
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(resource_plan(cpu))
    assert "rule x1 + rm x0.1 (style classifier)" in console.export_text()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_two_workers_shard_the_rm_and_score_as_transformers(tiny_model, tmp_path):
    """Two colocated workers: the RM is sharded with FSDP2 over both, the batch (5 rows: padded to 6) is split
    over them (DP_COMPUTE), and each row still scores as a plain transformers forward of its tokens."""
    import torch

    from rlkit.reward.rm_inputs import policy_token_rows
    from rlkit.trainer.run.workers_setup import rl_workers
    from tests.reward.rm_helpers import plain_scores, policy_batch, save_rm
    from tests.trainer.conftest import ensure_ray

    rm = save_rm(tmp_path / "rm")
    cfg = load_config(
        "grpo",
        toy_overrides(
            tmp_path,
            tiny_model,
            tmp_path,
            trainer__n_gpus_per_node=2,
            reward_model__enable=True,
            reward_model__model__path=rm,
            reward_model__micro_batch_size_per_gpu=2,
        ),
    )
    ensure_ray()
    workers = rl_workers(cfg, str(tiny_model), total_steps=1)
    try:
        assert workers.reward_model is not None and workers.world_size == 2
        batch = policy_batch(
            ["copy the digits : 7", "copy the digits : 1 2", "what is 3 + 4 ?", "copy the digits : 5", "reverse : 9 8"],
            ["7", "1 2", "the answer is 7", "5 5 5", "8 9"],
        )
        got = workers.reward_model.compute_rm_score(batch)["rm_scores"]
    finally:
        workers.shutdown()
    assert got.shape == batch["responses"].shape
    rows = policy_token_rows(batch["input_ids"], batch["attention_mask"], batch["response_mask"])
    assert torch.allclose(got.sum(-1), plain_scores(rm, rows), atol=1e-5, rtol=0)
