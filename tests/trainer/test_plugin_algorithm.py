"""A newly registered estimator, policy loss and aggregation mode (tests/trainer/algo_plugin.py, outside
rlkit) go through the config checks and a real short fit on the tiny model, with no edit to rlkit: the
driver provides what they declare (groups, the reference model), and the Ray workers find the loss and the
mode by name because they import the plugin module the driver registered them from."""

from __future__ import annotations

import importlib
import sys

import pytest

from tests.trainer.conftest import fit, toy_overrides, train_rows

PLUGIN = "tests.trainer.algo_plugin"


@pytest.fixture
def plugin():
    sys.modules.pop(PLUGIN, None)
    module = importlib.import_module(PLUGIN)
    module.CALLS.clear()
    yield module
    module.unregister()
    sys.modules.pop(PLUGIN, None)


@pytest.mark.slow
def test_plugin_entries_train(plugin, toy_data, tiny_model, tmp_path):
    from rlkit.registry import extension_modules

    assert PLUGIN in extension_modules()  # what the workers will import
    overrides = toy_overrides(
        toy_data, tiny_model, tmp_path, algorithm__adv_estimator=plugin.ESTIMATOR,
        actor_rollout_ref__actor__policy_loss=plugin.LOSS, actor_rollout_ref__actor__loss_agg_mode=plugin.AGG,
        actor_rollout_ref__rollout__n=4, actor_rollout_ref__actor__ppo_micro_batch_size_per_gpu=24,
        trainer__total_training_steps=2, trainer__save_freq=-1,
    )
    summary, rows, _ = fit("grpo", overrides, tmp_path / "logs")
    steps = train_rows(rows)
    assert summary.steps == 2 and len(steps) == 2
    assert plugin.CALLS == [64, 64]  # the estimator ran on each step's 16 prompts x n=4
    for row in steps:
        assert row["actor/pg_clipfrac"] == pytest.approx(plugin.SENTINEL_CLIPFRAC)  # the plugin loss ran
        assert "timing_s/ref" in row  # the reference was built and ran because the loss needs it
        assert "critic/values/mean" not in row


def test_workers_without_the_plugin_name_what_is_missing(toy_data, tiny_model, tmp_path):
    """Without the plugin nothing is registered under its names: the config check says so before Ray starts."""
    from rlkit.errors import UserError
    from rlkit.trainer.run.run_config import load_config

    with pytest.raises(UserError, match="test_plugin_ref_anchored' is not registered"):
        load_config("grpo", toy_overrides(toy_data, tiny_model, tmp_path,
                                          actor_rollout_ref__actor__policy_loss="test_plugin_ref_anchored"))
    with pytest.raises(UserError, match="trainer.plugins: cannot import 'tests.trainer.no_such_plugin'"):
        load_config("grpo", toy_overrides(toy_data, tiny_model, tmp_path,
                                          trainer__plugins="[tests.trainer.no_such_plugin]"))


def test_plugins_key_registers_for_the_cli(toy_data, tiny_model, tmp_path):
    """`trainer.plugins=[module]` imports the module first, so `rlkit train` accepts its names."""
    from rlkit.trainer.run.run_config import load_config

    sys.modules.pop(PLUGIN, None)
    try:
        cfg = load_config("grpo", toy_overrides(toy_data, tiny_model, tmp_path, trainer__plugins=f"[{PLUGIN}]",
                                                actor_rollout_ref__actor__policy_loss="test_plugin_ref_anchored"))
        assert cfg.actor_rollout_ref.actor.policy_loss == "test_plugin_ref_anchored"
    finally:
        if PLUGIN in sys.modules:
            sys.modules[PLUGIN].unregister()
            sys.modules.pop(PLUGIN, None)
