"""Per-step profiles of the worker calls (verl's `global_profiler` keys): what a user opens in Perfetto or TensorBoard.

The driver turns the config into a `ProfilePlan` (rlkit/trainer/run/workers_setup.py) that travels to every worker
process in `$RLKIT_PROFILE`; each process's `StepProfiler` wraps the worker calls of the listed steps, for the roles
and ranks the plan selects, and writes one file per call:

    <save_path>/step_<N>/<role>_rank<R>_<call>.pt.trace.json   tool=torch: a Chrome trace (Perfetto, chrome://tracing,
                                                               TensorBoard's profiler plugin reads *.pt.trace.json)
    <save_path>/step_<N>/<role>_rank<R>_<call>.pickle          tool=torch_memory: a CUDA memory snapshot
                                                               (https://pytorch.org/memory_viz)

A call made again in the same step (the validation after step N generates with step N) gets `_2`, `_3`...

A call is traced whole: `generate_sequences` includes the engine's wake-up and sleep, `update_actor` every micro-batch.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

ENV = "RLKIT_PROFILE"


@dataclass
class RoleSelection:
    ranks: list[int] | None  # None = every rank
    contents: list[str] = field(default_factory=list)


@dataclass
class ProfilePlan:
    tool: str
    steps: list[int]
    save_path: str  # absolute: workers do not share the driver's working directory
    roles: dict[str, RoleSelection]  # worker role name ("actor", "ref", "rollout", "critic", ...) -> selection
    memory: dict[str, object] = field(default_factory=dict)  # torch_memory: _record_memory_history's options

    def to_env(self) -> dict[str, str]:
        return {ENV: json.dumps(asdict(self))}

    @classmethod
    def from_env(cls) -> ProfilePlan | None:
        raw = os.environ.get(ENV)
        if not raw:
            return None
        data = json.loads(raw)
        data["roles"] = {name: RoleSelection(**sel) for name, sel in data["roles"].items()}
        return cls(**data)

    def selects(self, role: str, rank: int, step: int | None) -> RoleSelection | None:
        sel = self.roles.get(role)
        if sel is None or step not in self.steps or (sel.ranks is not None and rank not in sel.ranks):
            return None
        return sel

    def path(self, step: int, role: str, rank: int, call: str, suffix: str) -> Path:
        return Path(self.save_path) / f"step_{step}" / f"{role}_rank{rank}_{call}{suffix}"


class StepProfiler:
    """Wraps one worker process's calls; a no-op for the calls the plan does not select."""

    def __init__(self, plan: ProfilePlan | None, rank: int) -> None:
        self.plan, self.rank = plan, rank
        self.calls: dict[tuple[int, str, str], int] = {}  # a call made twice in a step (validation) gets _2, _3...

    @contextmanager
    def around(self, role: str, call: str, step: int | None) -> Iterator[None]:
        sel = self.plan.selects(role, self.rank, step) if self.plan is not None else None
        if sel is None:
            yield
            return
        assert self.plan is not None and step is not None
        record = _torch_trace if self.plan.tool == "torch" else _memory_snapshot
        seen = self.calls[(step, role, call)] = self.calls.get((step, role, call), 0) + 1
        with record(self.plan, sel, self.plan.path(step, role, self.rank, call, f"_{seen}" if seen > 1 else "")):
            yield


@contextmanager
def _torch_trace(plan: ProfilePlan, sel: RoleSelection, stem: Path) -> Iterator[None]:
    from torch.profiler import ProfilerActivity, profile

    contents = set(sel.contents) or {"cpu", "cuda"}
    activities = [ProfilerActivity.CPU] if "cpu" in contents else []
    if "cuda" in contents and torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities or [ProfilerActivity.CPU], record_shapes="shapes" in contents,
                 profile_memory="memory" in contents, with_stack="stack" in contents) as prof:
        yield
    stem.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(stem.with_name(stem.name + ".pt.trace.json")))


@contextmanager
def _memory_snapshot(plan: ProfilePlan, sel: RoleSelection, stem: Path) -> Iterator[None]:
    """CUDA only (the config check refuses it on CPU): the caching allocator's history during the call."""
    import pickle

    memory = torch.cuda.memory
    memory._record_memory_history(enabled="all", context=plan.memory.get("context", "all"),
                                  stacks=plan.memory.get("stacks", "all"),
                                  max_entries=int(plan.memory.get("trace_alloc_max_entries", 100_000)))
    try:
        yield
        snapshot = memory._snapshot()
    finally:
        memory._record_memory_history(enabled=None)
    stem.parent.mkdir(parents=True, exist_ok=True)
    stem.with_name(stem.name + ".pickle").write_bytes(pickle.dumps(snapshot))
