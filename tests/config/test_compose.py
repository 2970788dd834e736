"""Hydra composition: presets are the `algorithm` group, the full override grammar, user YAML trees (verl style)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rlkit.config.load import compose_config, preset_names, to_dict
from rlkit.config.schema import RLConfig
from rlkit.errors import UserError

HF = ["actor_rollout_ref.rollout.name=hf"]


def _dict(algo: str, overrides: list[str], **kw) -> dict:
    return to_dict(compose_config(algo, HF + overrides, **kw))


def test_verl_style_overrides_equal_plain_ones():
    """A run script's `+`, `++`, `~`, lists and interpolation compose to the same config as plain overrides."""
    verl_style = [
        "algorithm.adv_estimator=rloo",
        "+reward_model.scorer_kwargs.gsm8k.method=flexible",  # + adds a key below a free-form mapping
        "++actor_rollout_ref.rollout.n=8",  # ++ sets an existing key
        "++trainer.project_name=exp",
        "~reward_model.overlong_buffer",  # ~ deletes: back to the schema default (dapo turned it on)
        "~actor_rollout_ref.actor.clip_ratio_high",
        "trainer.logger=[console,file]",
        "data.val_batch_size=${data.train_batch_size}",
        "data.train_files=~/data/gsm8k/train.parquet",  # not Hydra's grammar: read as the string it is
    ]
    plain = [
        "algorithm.adv_estimator=rloo",
        "reward_model.scorer_kwargs={gsm8k: {method: flexible}}",
        "actor_rollout_ref.rollout.n=8",
        "trainer.project_name=exp",
        "reward_model.overlong_buffer={enable: false, len: 64, penalty_factor: 1.0}",
        "actor_rollout_ref.actor.clip_ratio_high=null",
        "trainer.logger=[console,file]",
        "data.val_batch_size=64",
        "data.train_files='~/data/gsm8k/train.parquet'",
    ]
    a, b = _dict("dapo", verl_style), _dict("dapo", plain)
    assert a == b
    assert a["reward_model"]["scorer_kwargs"] == {"gsm8k": {"method": "flexible"}}
    assert a["actor_rollout_ref"]["rollout"]["n"] == 8 and a["data"]["val_batch_size"] == 64
    assert a["reward_model"]["overlong_buffer"]["enable"] is False  # dapo's preset value is gone
    assert a["trainer"]["default_local_dir"] == "checkpoints/exp/run"  # schema interpolations resolve


def test_presets_are_the_algorithm_group():
    assert {"grpo", "ppo", "rloo", "dapo", "gspo", "reinforce_pp", "remax"} <= set(preset_names())
    ppo, grpo = compose_config("ppo", HF), compose_config("grpo", HF)
    assert ppo.algorithm.adv_estimator == "gae" and ppo.critic.enable is True
    assert grpo.algorithm.adv_estimator == "grpo" and grpo.actor_rollout_ref.rollout.n == 4
    with pytest.raises(UserError, match="Did you mean grpo"):
        compose_config("grpoo")


@pytest.mark.parametrize(
    "override, expect",
    [
        ("actor_rollout_ref.rollout.nn=4", "unknown config key 'actor_rollout_ref.rollout.nn' (from command line"),
        ("+actor_rollout_ref.rollout.nn=4", "unknown config key 'actor_rollout_ref.rollout.nn' (from command line"),
        ("~data.max_prompt_len", "Closest valid keys: data.max_prompt_length"),
        ("+data.train_batch_size=4", "item is already at 'data.train_batch_size'"),
        ("data.train_batch_size=4,8", "Ambiguous value"),
        ("data.train_batch_size", "is not in Hydra's override grammar"),
        ("+=3", "names no key"),
        ("++data.train_batch_size=abc", "bad value for 'data.train_batch_size' (from command line)"),
        ("algorithm=ppo", "the algorithm is the first argument"),
        ("data.val_batch_size=${data.nope}", "data.nope"),
    ],
)
def test_override_errors_are_one_line(override, expect):
    with pytest.raises(UserError) as info:
        compose_config("grpo", HF + [override])
    assert expect in str(info.value)
    assert "\n" not in str(info.value)


def test_user_tree_as_verl_loads_it(tmp_path):
    """--config-path/--config-name: the user's primary config, its own groups, over rlkit's base and preset."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "small.yaml").write_text("train_batch_size: 8\nmax_prompt_length: 64\n")
    (tmp_path / "run.yaml").write_text(
        "defaults:\n  - data: small\n  - _self_\n"
        "actor_rollout_ref:\n  actor:\n    ppo_mini_batch_size: 4\n"
    )
    cfg = compose_config("ppo", HF + ["data.max_response_length=32"], config_path=str(tmp_path),
                         config_name="run")
    # a group of the user's tree lands at its own package (data/small.yaml -> data.*)
    assert (cfg.data.train_batch_size, cfg.data.max_prompt_length, cfg.data.max_response_length) == (8, 64, 32)
    assert cfg.actor_rollout_ref.actor.ppo_mini_batch_size == 4 and cfg.algorithm.adv_estimator == "gae"
    # verl style: the user's defaults list names rlkit's base itself
    (tmp_path / "verl.yaml").write_text("defaults:\n  - rlkit\n  - _self_\ndata:\n  train_batch_size: 16\n")
    cfg = compose_config("rloo", HF, config_path=str(tmp_path), config_name="verl.yaml")
    assert cfg.data.train_batch_size == 16 and cfg.algorithm.adv_estimator == "rloo"


def test_user_tree_errors_name_the_file(tmp_path):
    (tmp_path / "run.yaml").write_text("data:\n  max_prompt_len: 64\n")
    with pytest.raises(UserError) as info:
        compose_config("grpo", HF, config_path=str(tmp_path), config_name="run")
    assert str(tmp_path / "run.yaml") in str(info.value) and "data.max_prompt_length" in str(info.value)
    (tmp_path / "grp").mkdir()
    (tmp_path / "grp" / "x.yaml").write_text("trainer:\n  total_epochs: two\n")
    (tmp_path / "two.yaml").write_text("defaults:\n  - grp@_global_: x\n  - _self_\n")
    with pytest.raises(UserError, match=f"bad value for 'trainer.total_epochs' \\(from the config tree {tmp_path}"):
        compose_config("grpo", HF, config_path=str(tmp_path), config_name="two")
    (tmp_path / "grp" / "broken.yaml").write_text("trainer: [unclosed\n")
    (tmp_path / "three.yaml").write_text("defaults:\n  - grp@_global_: broken\n")
    with pytest.raises(UserError) as info:
        compose_config("grpo", HF, config_path=str(tmp_path), config_name="three")
    assert str(info.value).startswith(f"{tmp_path / 'grp' / 'broken.yaml'}:2:1: not valid YAML: while parsing a flow")
    (tmp_path / "four.yaml").write_text("data:\n  train_batch_size: 8\n   bad: [1,\n")  # the primary, and --config
    for where in ({"config_path": str(tmp_path), "config_name": "four"}, {"config_file": str(tmp_path / "four.yaml")}):
        with pytest.raises(UserError) as info:
            compose_config("grpo", HF, **where)
        assert str(info.value) == f"{tmp_path / 'four.yaml'}:3:7: not valid YAML: mapping values are not allowed here"
    with pytest.raises(UserError, match="does not exist"):
        compose_config("grpo", HF, config_path=str(tmp_path), config_name="missing")
    with pytest.raises(UserError, match="go together"):
        compose_config("grpo", HF, config_path=str(tmp_path))


def test_config_file_is_merged_over_the_preset(tmp_path):
    path = tmp_path / "run.yml"  # any file name: --config reads one file
    path.write_text("actor_rollout_ref:\n  rollout:\n    n: 6\ntrainer:\n  experiment_name: e1\n")
    cfg = compose_config("grpo", HF + ["trainer.experiment_name=e2"], str(path))
    assert cfg.actor_rollout_ref.rollout.n == 6 and cfg.trainer.experiment_name == "e2"


def test_compose_leaves_no_files_and_keeps_the_working_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    compose_config("grpo", HF + ["trainer.total_epochs=2"])
    assert os.getcwd() == str(tmp_path) and list(Path(tmp_path).iterdir()) == []


def test_tilde_deletes_back_to_the_schema_default():
    cfg = compose_config("gspo", HF + ["~actor_rollout_ref.actor.policy_loss"])
    assert cfg.actor_rollout_ref.actor.policy_loss == RLConfig().actor_rollout_ref.actor.policy_loss == "vanilla"


def test_values_outside_hydras_grammar_are_read_as_strings():
    cfg = compose_config("grpo", HF + ["data.train_files=[~/a.parquet,~/b.parquet]",
                                       "trainer.debug.break_at=[actor.update_policy:step=2,critic.update]",
                                       "trainer.experiment_name=run=3"])
    assert cfg.data.train_files == ["~/a.parquet", "~/b.parquet"]
    assert cfg.trainer.debug.break_at == ["actor.update_policy:step=2", "critic.update"]
    assert cfg.trainer.experiment_name == "run=3"
