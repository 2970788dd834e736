"""verl's profiler keys: `global_profiler` (which tool, which steps, where) and each role's `profiler` (which ranks).

A role is traced at a step when `global_profiler.tool` is set, the step is in `global_profiler.steps` and the
role's `profiler.enable` is true, on the ranks its `all_ranks` / `ranks` select (rank 0 when neither says).
Each worker call of a traced step writes one torch profiler trace (rlkit/utils/profiling.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlkit.errors import UserError

#: `global_profiler.tool` values rlkit runs, and the fix for the ones it does not
TOOLS = ("torch", "torch_memory")
REFUSED_TOOLS = {
    "nsys": "NVIDIA Nsight wraps CUDA processes from outside Python; rlkit writes torch profiler traces "
            "(set global_profiler.tool=torch; they show CUDA kernels too)",
    "npu": "Ascend NPUs are not supported by rlkit",
    "precision_debugger": "verl's precision debugger is Ascend's msprobe; for non-finite values use "
                          "`rlkit train --debug nan`",
}
#: `profiler.tool_config.torch.contents` entries (verl's names)
TORCH_CONTENTS = ("cpu", "cuda", "memory", "shapes", "stack")


def f(default: Any = None, help: str = "", factory: Any = None) -> Any:  # noqa: A002 - "help" reads best in the schema
    if factory is not None:
        return field(default_factory=factory, metadata={"help": help})
    return field(default=default, metadata={"help": help})


@dataclass
class TorchToolConfig:
    contents: list[str] = f(factory=list, help="what a trace records: cpu, cuda, memory (tensor allocations), shapes, "
                            "stack (source lines); empty = cpu, plus cuda on a GPU")


@dataclass
class RoleToolConfig:
    torch: TorchToolConfig = f(factory=TorchToolConfig, help="torch profiler options of this role")


@dataclass
class RoleProfilerConfig:
    enable: bool = f(False, "trace this role's worker calls at global_profiler.steps")
    all_ranks: bool = f(False, "trace every rank of this role")
    ranks: list[int] = f(factory=list, help="ranks to trace when not all_ranks; empty = rank 0")
    tool_config: RoleToolConfig = f(factory=RoleToolConfig, help="per-tool options")


@dataclass
class TorchMemoryConfig:
    trace_alloc_max_entries: int = f(100_000, "CUDA allocation events kept in a memory snapshot")
    context: str = f("all", "torch.cuda.memory._record_memory_history context: state | alloc | all")
    stacks: str = f("all", "stacks recorded: python | all (python + C++)")


@dataclass
class GlobalToolConfig:
    torch_memory: TorchMemoryConfig = f(factory=TorchMemoryConfig, help="CUDA memory snapshots (tool=torch_memory)")


@dataclass
class GlobalProfilerConfig:
    tool: str | None = f(None, "profiler: torch (a torch profiler trace per worker call, for Perfetto / TensorBoard) "
                         "| torch_memory (a CUDA memory snapshot per call, GPU only) | null = off")
    steps: list[int] | None = f(None, "training steps to profile (1-based), e.g. [1,5]")
    save_path: str = f("outputs/profile", "folder of the traces: <save_path>/step_<N>/<role>_rank<R>_<call>.*")
    global_tool_config: GlobalToolConfig = f(factory=GlobalToolConfig, help="per-tool options")


def check_profiler(profiler: GlobalProfilerConfig, roles: dict[str, RoleProfilerConfig], device: str) -> None:
    """One line for a profiler config that would record nothing or cannot run here (`device`: trainer.device)."""
    tool = profiler.tool
    if tool is None:
        return
    if tool in REFUSED_TOOLS:
        raise UserError(f"global_profiler.tool={tool} is not supported by rlkit: {REFUSED_TOOLS[tool]}")
    if tool not in TOOLS:
        raise UserError(f"global_profiler.tool={tool}: use one of {', '.join(TOOLS)} (or null)")
    if tool == "torch_memory" and not _on_gpu(device):
        raise UserError("global_profiler.tool=torch_memory records the CUDA caching allocator and needs a GPU; on "
                        "CPU set global_profiler.tool=torch and <role>.profiler.tool_config.torch.contents=[memory]")
    if not profiler.steps:
        raise UserError(f"global_profiler.tool={tool} needs the steps to profile: set global_profiler.steps, e.g. "
                        "global_profiler.steps=[1,2]")
    if not any(r.enable for r in roles.values()):
        raise UserError(f"global_profiler.tool={tool} traces the roles whose profiler.enable is true and none is: set "
                        f"e.g. {next(iter(roles))}.profiler.enable=true")
    for section, role in roles.items():
        bad = [c for c in role.tool_config.torch.contents if c not in TORCH_CONTENTS]
        if bad:
            raise UserError(f"{section}.profiler.tool_config.torch.contents: unknown {bad}; use some of "
                            f"{list(TORCH_CONTENTS)}")


def _on_gpu(device: str) -> bool:
    if device != "auto":
        return device == "cuda"
    import torch

    return torch.cuda.is_available()
