"""verl's profiler keys: what turns tracing on, what rlkit refuses with a line, and the plan the workers read."""

from __future__ import annotations

import pytest

from rlkit.errors import UserError
from rlkit.trainer.run.run_config import load_config
from rlkit.trainer.run.workers_setup import profile_plan

BASE = ["data.train_files=/tmp/x.parquet", "actor_rollout_ref.model.path=/tmp/model", "trainer.device=cpu"]


def test_the_plan_selects_enabled_roles_their_ranks_and_an_absolute_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = load_config("grpo", [*BASE, "global_profiler.tool=torch", "global_profiler.steps=[1,3]",
                               "actor_rollout_ref.actor.profiler.enable=true",
                               "actor_rollout_ref.rollout.profiler.enable=true",
                               "actor_rollout_ref.rollout.profiler.all_ranks=true",
                               "critic.profiler.ranks=[1]"])  # not enabled: not traced
    plan = profile_plan(cfg)
    assert plan is not None and plan.tool == "torch" and plan.steps == [1, 3]
    assert plan.save_path == str(tmp_path / "outputs" / "profile")
    assert set(plan.roles) == {"actor", "rollout"}
    assert plan.selects("actor", 0, 1) and not plan.selects("actor", 1, 1) and not plan.selects("actor", 0, 2)
    assert plan.selects("rollout", 5, 3) and not plan.selects("critic", 1, 1)
    assert profile_plan(load_config("grpo", BASE)) is None  # off by default


@pytest.mark.parametrize(("overrides", "fix"), [
    (["global_profiler.tool=torch", "actor_rollout_ref.actor.profiler.enable=true"], "global_profiler.steps=[1,2]"),
    (["global_profiler.tool=torch", "global_profiler.steps=[1]"], "profiler.enable=true"),
    (["global_profiler.tool=torch", "global_profiler.steps=[1]", "actor_rollout_ref.actor.profiler.enable=true",
      "actor_rollout_ref.actor.profiler.tool_config.torch.contents=[cpu,flops]"], "unknown ['flops']"),
])
def test_what_cannot_run_says_the_fix_in_one_line(overrides, fix):
    with pytest.raises(UserError) as err:
        load_config("grpo", [*BASE, *overrides])
    assert fix in str(err.value) and "\n" not in str(err.value)


def test_verls_interpolated_role_keys_are_accepted_with_a_notice():
    notices: list[str] = []
    load_config("grpo", [*BASE, "+actor_rollout_ref.actor.profiler.tool=torch",
                         "+actor_rollout_ref.actor.profiler.tool_config.torch.discrete=true"], notices=notices)
    assert any("one profiler per run" in n for n in notices)
    assert any("one trace per worker call" in n for n in notices)
