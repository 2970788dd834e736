"""Build the worker groups a config asks for: one colocated group (actor + rollout [+ ref] [+ critic]).

All roles share one Ray actor per device (the hybrid engine), so weights move
from the FSDP actor to the rollout engine in memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlkit.algo.needs import critic_enabled, ref_needed
from rlkit.config.checks import world_size
from rlkit.config.schema import RLConfig
from rlkit.controller import ClassWithInitArgs, RayWorkerGroup, ResourcePool, WorkerGroupView


@dataclass
class WorkerHandles:
    group: RayWorkerGroup
    actor: WorkerGroupView
    rollout: WorkerGroupView
    ref: WorkerGroupView | None
    critic: WorkerGroupView | None
    world_size: int
    init_info: dict[str, Any]

    def shutdown(self) -> None:
        self.group.shutdown()
        self.group.pool.release()


def use_gpu(cfg: RLConfig) -> bool:
    if cfg.trainer.device == "cpu":
        return False
    import ray

    gpus = ray.cluster_resources().get("GPU", 0)
    if cfg.trainer.device == "cuda" and not gpus:
        from rlkit.errors import UserError

        raise UserError("trainer.device=cuda but the Ray cluster has no GPU; use trainer.device=cpu or auto")
    return gpus > 0


def build_workers(cfg: RLConfig, model_path: str, total_steps: int, runtime_env: dict | None = None) -> WorkerHandles:
    from rlkit.trainer.roles import actor_role, critic_role, ref_role
    from rlkit.workers.rollout_worker import RolloutWorker

    t = cfg.trainer
    pool = ResourcePool([t.n_gpus_per_node] * t.nnodes, use_gpu=use_gpu(cfg), cpus_per_process=t.cpus_per_worker,
                        name="global_pool")
    roles = {
        "actor": actor_role(cfg, model_path, total_steps),
        "rollout": ClassWithInitArgs(RolloutWorker, cfg, model_path),
    }
    if ref_needed(cfg):
        roles["ref"] = ref_role(cfg, model_path)
    if critic_enabled(cfg):
        roles["critic"] = critic_role(cfg, model_path, total_steps)
    group = RayWorkerGroup(pool, roles, name_prefix="rlkit", runtime_env=runtime_env)
    handles = WorkerHandles(
        group=group,
        actor=group.role("actor"),
        rollout=group.role("rollout"),
        ref=group.role("ref") if "ref" in roles else None,
        critic=group.role("critic") if "critic" in roles else None,
        world_size=world_size(cfg),
        init_info={},
    )
    handles.init_info["actor"] = handles.actor.init_model()
    if handles.ref is not None:
        handles.ref.init_model()
    if handles.critic is not None:
        handles.critic.init_model()
    handles.init_info["rollout"] = handles.rollout.init_model()
    return handles
