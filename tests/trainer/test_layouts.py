"""`plan_layout`/`role_specs`: one function decides both worker layouts (no Ray needed to check them).

The layouts running for real: tests/hybrid/test_layouts_sync.py (vLLM) and
tests/trainer/test_break_at_steps.py (hf, every role).
"""

from __future__ import annotations

import io

from rich.console import Console

from rlkit.controller import Sibling
from rlkit.trainer.kinds.rl_launch import plan as resource_plan
from rlkit.trainer.run.roles import role_specs
from rlkit.trainer.run.run_config import load_config
from rlkit.trainer.run.run_plan import plan_layout
from rlkit.workers.rollout_worker import RolloutWorker
from tests.trainer.conftest import toy_overrides


def _cfg(toy_data, tiny_model, tmp_path, **extra):
    return load_config("ppo", toy_overrides(toy_data, tiny_model, tmp_path, actor_rollout_ref__actor__use_kl_loss=True,
                                            **extra))


def _plan_text(cfg) -> str:
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(resource_plan(cfg))
    return console.export_text()


def test_colocated_layout_hands_the_actor_to_the_rollout(toy_data, tiny_model, tmp_path):
    cfg = _cfg(toy_data, tiny_model, tmp_path, trainer__n_gpus_per_node=2, trainer__cpus_per_worker=0.5)
    layout = plan_layout(cfg)
    assert not layout.separate_rollout and len(layout.groups) == 1
    group = layout.groups[0]
    assert group.roles == ["actor", "rollout", "ref", "critic"]  # the rollout after the actor it is handed
    assert (group.name, group.per_node, group.nnodes, group.cpus_per_process) == ("rlkit", 2, 1, 0.5)
    [specs] = role_specs(cfg, layout, str(tiny_model), total_steps=3)
    rollout = specs["rollout"]
    assert rollout.cls is RolloutWorker and rollout.kwargs == {"actor": Sibling("actor"), "router_replay": False}
    assert rollout.args[0] is cfg.actor_rollout_ref.rollout and rollout.args[0].free_cache_engine
    assert "actor, rollout (hf), ref, critic" in _plan_text(cfg)


def test_separate_rollout_layout_has_a_group_of_its_own(toy_data, tiny_model, tmp_path):
    cfg = _cfg(toy_data, tiny_model, tmp_path, trainer__one_step_off_policy=True, trainer__rollout_workers_per_node=2,
               trainer__rollout_cpus_per_worker=0.5)
    layout = plan_layout(cfg)
    assert layout.separate_rollout and [g.roles for g in layout.groups] == [["actor", "ref", "critic"], ["rollout"]]
    rollout_group = layout.groups[1]
    assert (rollout_group.name, rollout_group.per_node, rollout_group.cpus_per_process) == ("rlkit-rollout", 2, 0.5)
    assert rollout_group.env["VLLM_CPU_OMP_THREADS_BIND"]  # the engine's threads are not pinned to the actor's cores
    trainer_specs, rollout_specs = role_specs(cfg, layout, str(tiny_model), total_steps=3)
    spec = rollout_specs["rollout"]
    assert spec.kwargs == {"router_replay": False}  # no actor: weights by the object store
    assert spec.args[0] is cfg.actor_rollout_ref.rollout
    assert not cfg.actor_rollout_ref.rollout.free_cache_engine  # never sleeps: finalize set it, --dry-run shows it
    text = _plan_text(cfg)
    assert "actor, ref, critic" in text and "separate rollout (hf) workers" in text and "1 node(s) x 2 = 2" in text
