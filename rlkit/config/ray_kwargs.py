"""verl's `ray_kwargs`: what the run passes to `ray.init` (rlkit/trainer/run/ray_init_kwargs.py merges it with
rlkit's own arguments) and where Ray's timeline goes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class RayKwargsConfig:
    ray_init: dict[str, Any] = field(default_factory=dict, metadata={"help": (
        "keyword arguments of ray.init, as verl passes them: runtime_env (env_vars, py_executable, working_dir, "
        "pip, ...; merged with rlkit's own env_vars, yours win), num_cpus (--num-cpus wins), num_gpus, "
        "object_store_memory, ...; joining a running cluster, what Ray ignores there is said in one line")})
    timeline_json_file: str | None = field(default=None, metadata={"help": (
        "write Ray's timeline (a Chrome trace of every task and actor call, for chrome://tracing or Perfetto) to "
        "this file when the run ends; null = none")})
