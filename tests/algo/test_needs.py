"""Algorithm entries declare what they need (rlkit.algo.needs); the config checks, the worker layout and the
micro-batch loss scales act on the declarations. Entries registered here, in a test, are found everywhere
without an edit to rlkit (the end-to-end fit is tests/trainer/test_plugin_algorithm.py)."""

from __future__ import annotations

import pytest
import torch

from rlkit.algo import ADV_ESTIMATORS, LOSS_AGG, POLICY_LOSSES, agg_loss, masked_sum
from rlkit.algo.needs import Needs, needs, needs_of, rows, sequences
from rlkit.algo.run_needs import agg_unit, critic_enabled, ref_needed, run_needs
from rlkit.errors import UserError
from rlkit.trainer.run.run_config import load_config
from rlkit.workers.micro_batch import loss_scales

HF = ["actor_rollout_ref.rollout.name=hf"]


def test_builtin_declarations():
    assert needs_of(ADV_ESTIMATORS, "gae") == Needs(values=True)
    assert needs_of(ADV_ESTIMATORS, "remax") == Needs(greedy_baseline=True)
    for name in POLICY_LOSSES.names():
        assert needs_of(POLICY_LOSSES, name) == Needs(), name
    for name in LOSS_AGG.names():
        assert needs_of(LOSS_AGG, name).unit is not None, f"loss aggregation mode {name} declares no unit"
    assert needs_of(LOSS_AGG, "seq-mean-token-mean").unit is sequences
    assert Needs(values=True) | Needs(ref=True, unit=rows) == Needs(values=True, ref=True, unit=rows)


@pytest.fixture
def registered():
    """Register throw-away entries for one test and take them out again afterwards."""
    added: list[tuple] = []

    def add(registry, name, obj):
        registry.register(name)(obj)
        added.append((registry, name))
        return obj

    yield add
    for registry, name in added:
        registry.unregister(name)


def _baseline_free(inputs):
    return inputs.token_level_rewards, inputs.token_level_rewards


def _loss(old_log_prob, log_prob, advantages, response_mask, **_):
    zero = log_prob.new_zeros(())
    return {"pg_loss": agg_loss(-advantages * log_prob, response_mask), "pg_clipfrac": zero, "ppo_kl": zero,
            "pg_clipfrac_lower": zero}


def test_config_checks_and_layout_read_a_new_estimators_needs(registered):
    registered(ADV_ESTIMATORS, "test_grouped_critic", needs(groups=True, values=True)(_baseline_free))
    cfg = load_config("grpo", [*HF, "algorithm.adv_estimator=test_grouped_critic"])
    assert critic_enabled(cfg) and not ref_needed(cfg)  # a critic is built because the entry says so
    msg = str(pytest.raises(UserError, load_config, "grpo", [*HF, "algorithm.adv_estimator=test_grouped_critic",
                                                              "actor_rollout_ref.rollout.n=1"]).value)
    assert "algorithm.adv_estimator=test_grouped_critic compares samples of the same prompt" in msg
    assert "actor_rollout_ref.rollout.n >= 2" in msg
    msg = str(pytest.raises(UserError, load_config, "grpo", [*HF, "algorithm.adv_estimator=test_grouped_critic",
                                                              "critic.enable=false"]).value)
    assert "algorithm.adv_estimator=test_grouped_critic needs a critic" in msg and "critic.enable=true" in msg


def test_a_new_loss_that_reads_the_reference_gets_one(registered):
    registered(POLICY_LOSSES, "test_ref_loss", needs(ref=True)(_loss))
    plain = load_config("grpo", HF)
    assert not ref_needed(plain)
    cfg = load_config("grpo", [*HF, "actor_rollout_ref.actor.policy_loss=test_ref_loss"])
    assert ref_needed(cfg) and not critic_enabled(cfg)
    import io

    from rich.console import Console

    from rlkit.trainer.kinds.rl_launch import plan as resource_plan

    console = Console(width=200, record=True, file=io.StringIO())
    console.print(resource_plan(cfg))
    assert "actor, rollout (hf), ref" in console.export_text()  # the printed layout has the reference role


def test_greedy_baseline_is_a_run_need(registered):
    registered(ADV_ESTIMATORS, "test_greedy", needs(greedy_baseline=True)(_baseline_free))
    assert run_needs(load_config("grpo", [*HF, "algorithm.adv_estimator=test_greedy"])).greedy_baseline
    assert not run_needs(load_config("grpo", HF)).greedy_baseline


def test_unknown_names_list_the_registered_ones():
    msg = str(pytest.raises(UserError, load_config, "grpo", [*HF, "actor_rollout_ref.actor.policy_loss=vanila"]).value)
    assert "actor_rollout_ref.actor.policy_loss='vanila' is not registered" in msg and "'vanilla'" in msg
    msg = str(pytest.raises(UserError, load_config, "grpo", [*HF, "data.truncation=lft"]).value)
    assert "data.truncation='lft' is not registered" in msg and "'left'" in msg
    msg = str(pytest.raises(UserError, load_config, "grpo", ["actor_rollout_ref.rollout.name=hff"]).value)
    assert "actor_rollout_ref.rollout.name='hff' is not registered" in msg and "'hf'" in msg
    msg = str(pytest.raises(UserError, load_config, "grpo", [*HF, "trainer.logger=[console,tensorbord]"]).value)
    assert "trainer.logger='tensorbord' is not registered" in msg


def test_an_aggregation_mode_without_a_unit_is_refused(registered):
    registered(LOSS_AGG, "test_no_unit", lambda loss_mat, mask: masked_sum(loss_mat, mask))
    with pytest.raises(UserError, match="declares no unit"):
        agg_unit("test_no_unit")
    msg = str(pytest.raises(UserError, load_config, "grpo",
                            [*HF, "actor_rollout_ref.actor.loss_agg_mode=test_no_unit"]).value)
    assert "actor_rollout_ref.actor.loss_agg_mode=test_no_unit" in msg and "@needs(unit=" in msg


def test_loss_scales_use_a_new_modes_declared_unit(registered):
    def row_sum_mean(loss_mat, mask):  # mean over all rows of each row's summed loss
        return masked_sum(loss_mat, mask, dim=-1).mean()

    registered(LOSS_AGG, "test_row_sum_mean", needs(unit=rows)(row_sum_mean))
    loss_mat = torch.randn(6, 5, generator=torch.Generator().manual_seed(0))
    mask = (torch.arange(5)[None] < torch.tensor([5, 0, 2, 1, 4, 3])[:, None]).float()
    parts = [slice(0, 1), slice(1, 6)]
    scales = loss_scales([mask[p] for p in parts], "test_row_sum_mean")
    assert scales == pytest.approx([1 / 6, 5 / 6])
    total = sum(agg_loss(loss_mat[p], mask[p], "test_row_sum_mean") * w for p, w in zip(parts, scales))
    assert float(total) == pytest.approx(float(agg_loss(loss_mat, mask, "test_row_sum_mean")), rel=1e-6)


def test_lr_schedules_are_a_registry():
    from types import SimpleNamespace

    from rlkit.utils.lr_schedule import lr_lambda

    optim = SimpleNamespace(lr_warmup_steps=2, lr_warmup_steps_ratio=0.0, lr_scheduler_type="cosine", min_lr_ratio=0.1)
    fn = lr_lambda(optim, total_steps=12)
    assert [fn(0), fn(1)] == [0.5, 1.0]  # linear warmup
    assert fn(2) == pytest.approx(1.0) and fn(7) == pytest.approx(0.55) and fn(12) == pytest.approx(0.1)
    assert lr_lambda(SimpleNamespace(**{**vars(optim), "lr_scheduler_type": "constant"}), 12)(9) == 1.0
    msg = str(pytest.raises(UserError, load_config, "grpo",
                            [*HF, "actor_rollout_ref.actor.optim.lr_scheduler_type=cosin"]).value)
    assert "lr_scheduler_type='cosin' is not registered" in msg and "'cosine'" in msg  # was silently constant
