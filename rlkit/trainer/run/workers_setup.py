"""Spawn a run's worker groups and load their models, for every trainer kind and layout, with one function
(`build_workers`); `WorkerHandles` are what the trainers call.

The layout (which groups, which roles, on which resources) is decided before, purely, by the kind: the RL
run's `RunPlan` (rlkit/trainer/run/run_plan.py: colocated hybrid engine, separate engines, the reward model's
and the teachers' own groups), SFT's and DPO's one group of one role. For RL, `rl_workers` adds the weight
route to the engines: in memory when colocated (`InProcessRoute`: the rollout is handed its process's actor),
through Ray's object store for separate engines (`ObjectStoreRoute`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rlkit.config.schema import RLConfig
from rlkit.controller import ClassWithInitArgs, RayWorkerGroup, ResourcePool, WorkerGroupView
from rlkit.errors import UserError
from rlkit.rollout.lifecycle import BroadcastRoute, InProcessRoute, ObjectStoreRoute, WeightRoute
from rlkit.trainer.run.run_plan import Layout, RunPlan
from rlkit.utils.memory_peak import phase_metrics
from rlkit.utils.profiling import ProfilePlan


@dataclass
class WorkerHandles:
    """The worker groups of a run and a view per role (`views`; a role done by another's workers, such as a LoRA
    actor's reference, is that role's view); `weights` moves new weights to the engines (RL)."""

    groups: list[RayWorkerGroup]
    views: dict[str, WorkerGroupView]
    world_size: int
    weights: WeightRoute | None = None
    init_info: dict[str, Any] = field(default_factory=dict)

    def view(self, role: str) -> WorkerGroupView | None:
        return self.views.get(role)

    # the roles the trainers call, by name (None where the run has no such role)
    actor = property(lambda self: self.view("actor"))
    rollout = property(lambda self: self.view("rollout"))
    ref = property(lambda self: self.view("ref"))
    critic = property(lambda self: self.view("critic"))
    reward_model = property(lambda self: self.view("reward_model"))  # the classifier RM (reward_model.enable)
    teacher = property(lambda self: self.view("teacher"))  # the local distillation teachers
    model = property(lambda self: self.view("model"))  # SFT's and DPO's one role

    def set_step(self, step: int) -> None:
        """The trainer's global step, carried by every later call to every group (break_at's `step=`)."""
        for group in self.groups:
            group.step = step

    def sync_weights(self, **kwargs: Any) -> list[dict[str, float]]:
        """The actor's current weights -> every engine (the layout's route; see its `push`)."""
        assert self.weights is not None, "this run has no engines to sync"
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


def use_gpu(cfg: Any) -> bool:
    """Whether the workers take GPUs (`trainer.device`, or auto: the cluster has some)."""
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


def build_workers(layout: Layout, specs: Sequence[dict[str, ClassWithInitArgs]], gpu: bool, world: int,
                  runtime_env: dict | None = None, env: dict[str, str] | None = None,
                  checkpoints: str | None = None) -> WorkerHandles:
    """Spawn the layout's groups (`specs`: each group's roles with their constructor arguments), check that every
    node they landed on shares the `checkpoints` folder, load every model in the layout's order (its `background`
    roles while the others load) and return the handles."""
    if not gpu:
        _check_cpus(layout)
    groups: list[RayWorkerGroup] = []
    try:
        for plan, roles in zip(layout.groups, specs):
            taken = {node["node_id"] for group in groups for node in group.nodes} if plan.own_nodes else set()
            pool = ResourcePool([plan.per_node] * plan.nnodes, use_gpu=gpu, cpus_per_process=plan.cpus_per_process,
                                name=plan.pool, avoid_nodes=taken)
            groups.append(RayWorkerGroup(pool, roles, name_prefix=plan.name, runtime_env=runtime_env,
                                         env={**plan.env, **(env or {})}))
    except BaseException:
        for group in groups:
            group.shutdown()
            group.pool.release()
        raise
    if checkpoints:
        _check_shared(groups, checkpoints)
    views = {role: group.role(role) for plan, group in zip(layout.groups, groups) for role in plan.roles}
    views.update({role: views[to] for role, to in layout.aliases.items()})
    handles = WorkerHandles(groups, views, world)
    try:
        background = {role: views[role].init_model(blocking=False) for role in layout.background}
        for role in layout.load_order():
            handles.init_info[role] = views[role].init_model()
        for role, pending in background.items():
            handles.init_info[role] = pending.get()
    except BaseException:
        handles.shutdown()
        raise
    return handles


def _check_shared(groups: list[RayWorkerGroup], folder: str) -> None:
    """Every node writes and reads a probe file in the checkpoint folder (a no-op on one node): a checkpoint written
    by each rank must be readable by every rank on resume, so a folder local to each machine fails now, not then."""
    from rlkit.controller.worker_group import shared_folder_problems

    problems = shared_folder_problems(groups, folder)
    if problems:
        for group in groups:
            group.shutdown()
            group.pool.release()
        raise UserError("pre-flight check failed: trainer.default_local_dir is not one folder every node shares:\n"
                        + "\n".join(problems) + "\nset trainer.default_local_dir to a path every node mounts (NFS, "
                        "a cluster file system)")


def weight_route(cfg: RLConfig, layout: Layout, actor: WorkerGroupView, rollout: WorkerGroupView) -> WeightRoute:
    """Colocated: in memory; separate engines: `rollout.weight_transfer` (a broadcast, or Ray's object store)."""
    if not layout.separate_rollout:
        return InProcessRoute(rollout)
    r = cfg.actor_rollout_ref.rollout
    routes = {"broadcast": lambda: BroadcastRoute(actor, rollout, r.update_weights_bucket_megabytes),
              "object_store": lambda: ObjectStoreRoute(actor, rollout)}
    return routes[r.weight_transfer]()


def rl_workers(cfg: RLConfig, model_path: str, total_steps: int, runtime_env: dict | None = None,
               plan: RunPlan | None = None) -> WorkerHandles:
    """The RL run's groups (its plan's layout; computed when None) with the weight route to the engines."""
    from rlkit.config.checks import check_tensor_parallel
    from rlkit.rollout import tensor_parallel_backends
    from rlkit.trainer.run.roles import role_specs

    check_tensor_parallel(cfg, tensor_parallel_backends())  # also for configs that did not come through load_config
    plan = plan or RunPlan.of(cfg)
    layout = plan.layout
    profiling = profile_plan(cfg)
    specs = role_specs(cfg, layout, model_path, total_steps, plan)
    handles = build_workers(layout, specs, use_gpu(cfg), plan.world_size, runtime_env,
                            profiling.to_env() if profiling is not None else {}, cfg.trainer.default_local_dir)
    actor, rollout = handles.actor, handles.rollout
    handles.weights = weight_route(cfg, layout, actor, rollout)
    return handles
