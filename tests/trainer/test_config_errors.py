"""Bad configs fail at start-up with one clear line naming the key (UserError; exit 1 from the CLI, no traceback)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from rlkit.errors import UserError
from rlkit.trainer.run.run_config import load_config
from rlkit_cli.main import app
from tests.trainer.conftest import run_cli, toy_overrides

runner = CliRunner()
HF = ["actor_rollout_ref.rollout.name=hf"]


def _flat(text: str) -> str:
    return " ".join(text.split())


def _fails(overrides: list[str], algo: str = "grpo") -> str:
    with pytest.raises(UserError) as exc:
        load_config(algo, HF + overrides)
    return str(exc.value)


def test_unknown_key_names_the_closest_valid_keys():
    msg = _fails(["actor_rollout_ref.rollout.nn=4"])
    assert "unknown config key 'actor_rollout_ref.rollout.nn'" in msg
    assert "actor_rollout_ref.rollout.n," in msg
    msg = _fails(["data.train_batchsize=4"])
    assert "data.train_batch_size" in msg
    # a leaf put in the wrong group is found by its name
    msg = _fails(["trainer.ppo_mini_batch_size=4"])
    assert "actor_rollout_ref.actor.ppo_mini_batch_size" in msg


def test_unknown_key_in_a_config_file(tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("data:\n  train_batch_size: 8\n  max_prompt_len: 64\n")
    with pytest.raises(UserError) as exc:
        load_config("grpo", HF, str(cfg))
    assert str(cfg) in str(exc.value) and "data.max_prompt_length" in str(exc.value)


@pytest.mark.parametrize(
    "overrides, expect",
    [
        (["data.train_batch_size=6", "actor_rollout_ref.actor.ppo_mini_batch_size=4"],
         "ppo_mini_batch_size=4 must divide data.train_batch_size=6; e.g. set ppo_mini_batch_size=3"),
        (["data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=8"], "must divide"),
        (["trainer.n_gpus_per_node=3", "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
          "actor_rollout_ref.rollout.n=4"], "8 sequences must split evenly over 3 workers"),
        (["actor_rollout_ref.rollout.n=1", "algorithm.adv_estimator=grpo_passk"],
         "set actor_rollout_ref.rollout.n >= 2"),
        (["data.train_batch_size=abc"], "bad value for 'data.train_batch_size'"),
        (["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=0"], "must be >= 1"),
        (["algorithm.adv_estimator=grpoo"], "algorithm.adv_estimator='grpoo' is not registered"),
        (["actor_rollout_ref.rollout.name=vlm"], "actor_rollout_ref.rollout.name='vlm' is not registered"),
        (["actor_rollout_ref.rollout.mode=asynk"], "actor_rollout_ref.rollout.mode='asynk' is not registered"),
        (["data.train_files=null"], "data.train_files is empty"),
        (["trainer.n_gpus_per_node=2", "actor_rollout_ref.rollout.tensor_model_parallel_size=2"],
         "tensor_model_parallel_size=2 needs rollout.name=vllm"),
        (["trainer.n_gpus_per_node=2", "actor_rollout_ref.rollout.name=vllm",
          "actor_rollout_ref.rollout.tensor_model_parallel_size=4"], "must divide the 2 rollout workers"),
    ],
)
def test_inconsistent_or_bad_values(overrides, expect):
    assert expect in _fails(overrides)


def test_ppo_critic_batch_sizes_are_checked():
    sizes = ["trainer.n_gpus_per_node=2", "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=2"]
    msg = _fails([*sizes, "critic.ppo_mini_batch_size=3"], algo="ppo")
    assert "critic.ppo_mini_batch_size=3" in msg


def test_cli_config_errors_exit_1_without_traceback():
    for args, expect in [
        (["train", "grpo", "--dry-run", *HF, "actor_rollout_ref.rollout.nn=4"], "actor_rollout_ref.rollout.n"),
        (["train", "grpo", "--dry-run", *HF, "data.train_batch_size=6",
          "actor_rollout_ref.actor.ppo_mini_batch_size=4"], "must divide data.train_batch_size=6"),
        (["train", "grpoo", "--dry-run"], "Did you mean grpo"),
    ]:
        res = runner.invoke(app, args)
        assert res.exit_code == 1, res.output
        assert expect in _flat(res.output)
        assert "Traceback" not in res.output


def test_cli_dry_run_prints_the_plan(toy_data, tiny_model, tmp_path):
    res = runner.invoke(app, ["train", "grpo", "--dry-run", *toy_overrides(toy_data, tiny_model, tmp_path)])
    assert res.exit_code == 0, res.output
    assert "resource plan" in res.output and "16 prompts x n=8 = 128" in _flat(res.output)


def test_cli_dry_run_composes_a_user_config_tree(toy_data, tiny_model, tmp_path):
    """--config-path/--config-name (verl's way) and Hydra's override grammar go through the CLI."""
    conf = tmp_path / "conf"
    (conf / "trainer").mkdir(parents=True)
    (conf / "trainer" / "short.yaml").write_text(
        "total_training_steps: 3\nexperiment_name: from_tree\nproject_name: mine\n"
    )
    (conf / "run.yaml").write_text("defaults:\n  - trainer: short\n  - _self_\ndata:\n  val_max_samples: 5\n")
    res = runner.invoke(app, ["train", "rloo", "--dry-run", "--config-path", str(conf), "--config-name", "run",
                              *toy_overrides(toy_data, tiny_model, tmp_path), "~trainer.project_name",
                              "+reward_model.scorer_kwargs.gsm8k.method=flexible"])
    assert res.exit_code == 0, res.output
    out = " ".join(res.output.split())
    assert "adv_estimator: rloo" in out and "total_training_steps: 3" in out and "experiment_name: from_tree" in out
    assert "val_max_samples: 5" in out and "method: flexible" in out
    assert "project_name: rlkit" in out and "project_name: mine" not in out  # ~key: back to the schema default


def test_cli_dry_run_prints_the_separate_rollout_layout(toy_data, tiny_model, tmp_path):
    """One-step-off-policy's fix-ups are made by finalize: the printed config and plan are what runs."""
    res = runner.invoke(app, ["train", "grpo", "--dry-run", *toy_overrides(toy_data, tiny_model, tmp_path),
                              "trainer.one_step_off_policy=true", "trainer.rollout_workers_per_node=1"])
    assert res.exit_code == 0, res.output
    out = " ".join(res.output.split())
    assert "calculate_log_probs: true" in out and "rollout_is: token" in out and "free_cache_engine: false" in out
    assert "separate rollout (hf) workers" in out
    colocated = next(line for line in res.output.splitlines() if "colocated roles per worker" in line)
    assert "actor" in colocated and "rollout" not in colocated

@pytest.mark.slow
def test_cli_missing_train_file_is_one_line_exit_1(toy_data, tiny_model, tmp_path):
    """A real `rlkit train` process (its pre-flight check finds it before Ray starts): exit 1, the path named."""
    missing = tmp_path / "nope" / "train.parquet"
    res = run_cli("train", "grpo", "--num-cpus", "1",
                  *toy_overrides(toy_data, tiny_model, tmp_path, data__train_files=missing), timeout=180)
    assert res.returncode == 1, res.stdout + res.stderr
    assert str(missing) in _flat(res.stderr)
    assert "Traceback" not in res.stdout + res.stderr
