"""verl's `ray_kwargs.ray_init` merged into the arguments rlkit passes to `ray.init`, and the timeline file.

verl hands `ray_kwargs.ray_init` to `ray.init` as they are; rlkit does the same, on top of its own arguments:
- `runtime_env`: the user's (py_executable, working_dir, pip, ...) with rlkit's `env_vars` merged in key by key;
  the user's values win, except rlkit's own `RLKIT_*` variables, which its workers read;
- `num_cpus`: used for a private cluster unless `--num-cpus` says otherwise;
- everything else as given (num_gpus, object_store_memory, include_dashboard, _temp_dir, ...).
Joining a running cluster (`--address`, `$RAY_ADDRESS`, `rlkit cluster up`), the resources are the cluster's:
what `ray.init` refuses or ignores there is dropped and said in one line.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: ray.init arguments that only start a new cluster: refused (ValueError) or ignored when joining one
CLUSTER_ONLY = ("num_cpus", "num_gpus", "resources", "labels", "object_store_memory", "_system_config",
                "_enable_object_reconstruction", "_node_name", "include_dashboard", "dashboard_host",
                "dashboard_port", "_temp_dir", "_plasma_directory", "_memory")
RLKIT_VARS = "RLKIT_"  # env vars rlkit's own workers read: rlkit's value wins


def merge_env_vars(ours: Mapping[str, str], theirs: Mapping[str, Any]) -> dict[str, str]:
    """rlkit's env_vars with the user's on top (as strings, as Ray wants them), rlkit's own RLKIT_* kept."""
    merged = {**ours, **{str(k): str(v) for k, v in theirs.items() if v is not None}}
    merged.update({k: v for k, v in ours.items() if k.startswith(RLKIT_VARS)})
    return merged


def merge_ray_init(kwargs: dict[str, Any], user: Mapping[str, Any] | None, joining: bool,
                   cli_num_cpus: int | None = None) -> tuple[dict[str, Any], str | None]:
    """`kwargs` (rlkit's ray.init arguments) with `ray_kwargs.ray_init` merged in; the line saying what a joined
    cluster ignores (None when nothing is)."""
    user = {k: v for k, v in dict(user or {}).items() if v is not None}
    out = dict(kwargs)
    env = dict(user.pop("runtime_env", None) or {})
    if env:
        ours = dict(out.get("runtime_env") or {})
        merged = {**env, **{k: v for k, v in ours.items() if k != "env_vars"}}
        merged["env_vars"] = merge_env_vars(ours.get("env_vars", {}), env.get("env_vars") or {})
        out["runtime_env"] = merged
    user.pop("address", None)  # where to run is --address / $RAY_ADDRESS / `rlkit cluster up` (init_ray's choice)
    ignored = []
    for key, value in user.items():
        if joining and key in CLUSTER_ONLY:
            ignored.append(f"{key}={value}")
        elif key == "num_cpus" and cli_num_cpus is not None:
            continue  # --num-cpus wins
        else:
            out[key] = value
    if not ignored:
        return out, None
    return out, ("joining a running Ray cluster: ray_kwargs.ray_init " + ", ".join(ignored) + " ignored (the "
                 "cluster's own resources and settings apply; set them where it is started, e.g. `rlkit cluster up "
                 "--num-cpus N`)")


def write_timeline(path: str | None) -> str | None:
    """`ray_kwargs.timeline_json_file`: Ray's timeline of the run (every task and actor call) as a Chrome trace."""
    if not path:
        return None
    from pathlib import Path

    import ray

    target = Path(path).expanduser()
    target.parent.mkdir(parents=True, exist_ok=True)
    ray.timeline(filename=str(target))
    return str(target)
