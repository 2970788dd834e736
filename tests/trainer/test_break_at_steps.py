"""`break_at=PHASE:step=N` matches every role at step N, in both worker layouts (one-step-off included).

The driver's step travels with every worker call (not packed into the rollout's seed), so the
actor, reference and critic see it even where no rollout shares their process. The run is a real
PPO run (critic + reference) on Ray with the rule `*:rank=*:step=2` and Ray's breakpoint hook
off (RAY_DEBUG=0): each phase that matches prints its "[rlkit.debug] pausing at phase ..." line
(rlkit.debug.maybe_break) to the worker's stderr log and runs on; the test reads those lines.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import ray

from rlkit.models.resolve import resolve_model_path
from rlkit.trainer.run.run_config import load_config
from rlkit.trainer.run.workers_setup import rl_workers
from rlkit.trainer.step.rl_trainer import RLTrainer
from tests.trainer.conftest import toy_overrides

PAUSE_LINE = re.compile(r"\[rlkit\.debug\] pausing at phase '([\w.]+)' \(rank (\d+), step (\w+)\)")
TRAIN_PHASES = {"rollout.generate", "actor.compute_log_prob", "actor.update_policy", "ref.compute_log_prob",
                "critic.compute_values", "critic.update"}


def pause_lines(pids: list[int], timeout: float = 30.0, expect: int = 0) -> list[tuple[str, int, str]]:
    """(phase, rank, step) of every pause line the worker processes `pids` wrote to their Ray logs."""
    logs = Path(ray._private.worker._global_node.get_logs_dir_path())
    deadline = time.monotonic() + timeout
    while True:
        found = []
        for pid in pids:
            for path in logs.glob(f"worker-*-{pid}.err"):
                found += [(m[1], int(m[2]), m[3]) for m in PAUSE_LINE.finditer(path.read_text(errors="replace"))]
        if len(found) >= expect or time.monotonic() > deadline:  # log lines are flushed, files may lag a little
            return found
        time.sleep(0.5)


@pytest.mark.slow  # ~1 min per layout on 2 shared cores
@pytest.mark.timeout(900)
@pytest.mark.parametrize("one_step_off", [False, True], ids=["colocated", "one-step-off"])
def test_break_at_step_matches_every_role_in_both_layouts(one_step_off, toy_data, tiny_model, tmp_path, ray_local):
    overrides = toy_overrides(
        toy_data, tiny_model, tmp_path, trainer__total_training_steps=3, trainer__save_freq=-1,
        actor_rollout_ref__rollout__n=2, actor_rollout_ref__actor__use_kl_loss=True,
        actor_rollout_ref__actor__recompute_old_log_prob=True, critic__ppo_micro_batch_size_per_gpu=64,
        trainer__one_step_off_policy=one_step_off, trainer__rollout_cpus_per_worker=1,
    )
    cfg = load_config("ppo", overrides)
    env = {"RLKIT_BREAK_AT": "*:rank=*:step=2", "RAY_DEBUG": "0"}  # what --debug sets, minus the pause
    model = str(resolve_model_path(cfg.actor_rollout_ref.model.path))
    trainer = None
    try:
        workers = rl_workers(cfg, model, 3, runtime_env={"env_vars": env})
        trainer = RLTrainer(cfg, workers=workers)
        assert len(workers.groups) == (2 if one_step_off else 1)
        summary = trainer.fit()
        assert summary.steps == 3
        pids = sorted({p for g in workers.groups for p in ray.get([a.pid.remote() for a in g.actors])})
        lines = pause_lines(pids, expect=len(TRAIN_PHASES))
    finally:
        if trainer is not None:
            trainer.workers.shutdown()
    # every phase of the step paused once, at step 2, and no phase at another step
    assert sorted(phase for phase, _, _ in lines) == sorted(TRAIN_PHASES), lines
    assert {(rank, step) for _, rank, step in lines} == {(0, "2")}, lines
