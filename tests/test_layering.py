"""The package layering of docs/CONVENTIONS.md (Layers) holds: a module imports only from its own layer or below, and no
two modules import each other (directly or through others).

Every import counts: module-level, inside functions (lazy) and under TYPE_CHECKING, because a lazy
import that goes up a layer is still a dependency that goes up a layer.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# bottom to top; a module's layer is the first entry that is a prefix of its dotted name
LAYERS: list[tuple[str, ...]] = [
    ("rlkit.errors", "rlkit.registry", "rlkit.protocol", "rlkit.phases", "rlkit.batch_keys", "rlkit.testing"),
    ("rlkit.config",),
    ("rlkit.utils",),
    ("rlkit.debug",),
    ("rlkit.controller",),
    ("rlkit.algo",),
    ("rlkit.sandbox",),
    ("rlkit.reward",),
    ("rlkit.data",),
    ("rlkit.models",),
    ("rlkit.rollout",),
    ("rlkit.workers",),
    ("rlkit.eval",),
    ("rlkit.runs",),
    ("rlkit.trainer",),
    ("rlkit_cli",),
]
PACKAGES = ("rlkit", "rlkit_cli")


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, name: str, known: set[str]) -> set[str]:
    """The known modules `path` imports (`from pkg import mod` counts as importing `pkg.mod`)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([node.module] if node.module else []))
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        found.update(t for t in targets if t in known and t != name)
    return found


def import_graph(root: Path) -> dict[str, set[str]]:
    files = {module_name(p, root): p for pkg in PACKAGES for p in (root / pkg).rglob("*.py")}
    return {name: imports_of(path, name, set(files)) for name, path in files.items()}


def layer_of(name: str) -> int:
    if name in PACKAGES:
        return 0 if name == "rlkit" else len(LAYERS) - 1  # `rlkit/__init__.py` stays import-free
    for index, prefixes in enumerate(LAYERS):
        if any(name == p or name.startswith(p + ".") for p in prefixes):
            return index
    raise AssertionError(f"{name} belongs to no layer: add its package to LAYERS (and to docs/CONVENTIONS.md)")


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{src} (layer {layer_of(src)}) imports {dst} (layer {layer_of(dst)})"
        for src, targets in graph.items()
        for dst in targets
        if layer_of(dst) > layer_of(src)
    )


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_every_module_imports_only_its_layer_or_below():
    graph = import_graph(ROOT)
    assert len(graph) > 100, "the walk found too few modules: wrong root?"
    assert upward_imports(graph) == []


def test_no_import_cycles():
    assert cycles(import_graph(ROOT)) == []


def test_the_checks_catch_an_upward_import_and_a_cycle(tmp_path):
    """The two checks above can fail: a synthetic tree with one of each is reported."""
    (tmp_path / "rlkit" / "config").mkdir(parents=True)
    (tmp_path / "rlkit" / "trainer").mkdir()
    (tmp_path / "rlkit_cli").mkdir()
    for package in ("rlkit", "rlkit/config", "rlkit/trainer", "rlkit_cli"):
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "rlkit" / "config" / "schema.py").write_text("def f():\n    from rlkit.trainer import fit\n")
    (tmp_path / "rlkit" / "trainer" / "fit.py").write_text("from rlkit.trainer.loop import x\n")
    (tmp_path / "rlkit" / "trainer" / "loop.py").write_text("from . import fit\n")
    graph = import_graph(tmp_path)
    trainer = layer_of("rlkit.trainer")
    assert upward_imports(graph) == [
        f"rlkit.config.schema (layer 1) imports rlkit.trainer (layer {trainer})",
        f"rlkit.config.schema (layer 1) imports rlkit.trainer.fit (layer {trainer})",
    ]
    assert cycles(graph) == [["rlkit.trainer.fit", "rlkit.trainer.loop"]]
