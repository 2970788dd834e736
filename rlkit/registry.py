"""A tiny name -> object registry, used for every pluggable piece (dispatch modes,
advantage estimators, losses, scorers, rollout backends, trackers, tools).

Callers look things up by the name written in the config; nobody branches on names.

Entries may come from outside rlkit (plugins): a module that registers at import time, named
in `trainer.plugins` or imported by your own driver script. Worker processes only know what
they import, so `extension_modules()` lists the modules of every entry registered from
outside rlkit, and each worker imports them before it builds its roles (`import_plugins`).
"""

from __future__ import annotations

import difflib
import importlib
import logging
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, TypeVar

from rlkit.errors import UserError

T = TypeVar("T")
log = logging.getLogger(__name__)
_ALL: list[Registry[Any]] = []  # every registry, for extension_modules()


class Registry(Generic[T]):
    """`fill`: the modules whose import registers the built-in entries, imported at the first lookup, so a reader
    never has to know which import fills the registry (registries whose entries live beside them need none)."""

    def __init__(self, kind: str, fill: tuple[str, ...] = ()) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}
        self._fill = fill
        _ALL.append(self)

    def _loaded(self) -> dict[str, T]:
        """The entries, the built-in ones imported first (`fill`)."""
        if self._fill:
            modules, self._fill = self._fill, ()  # cleared first: a filling module may look the registry up
            for module in modules:
                importlib.import_module(module)
        return self._items

    def register(self, name: str, *aliases: str) -> Callable[[T], T]:
        """Decorator: `@REG.register("grpo")` adds the object under its name (and aliases)."""

        def deco(obj: T) -> T:
            for key in (name, *aliases):
                if key in self._items and self._items[key] is not obj:
                    raise ValueError(f"{self.kind} '{key}' is registered twice")
                self._items[key] = obj
            return obj

        return deco

    def add(self, name: str, obj: T) -> None:
        self.register(name)(obj)

    def unregister(self, *names: str) -> None:
        """Remove names (tests that register a throw-away entry put the registry back this way)."""
        for key in names:
            self._items.pop(key, None)

    def get(self, name: str) -> T:
        try:
            return self._loaded()[name]
        except KeyError:
            close = difflib.get_close_matches(name, self._items, n=3)
            hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
            raise UserError(f"unknown {self.kind} '{name}'. Known: {', '.join(sorted(self._items))}.{hint}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._loaded()

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._loaded()))

    def names(self) -> list[str]:
        return sorted(self._loaded())

    def builtin_names(self) -> list[str]:
        """Names of the entries rlkit itself registers (plugins left out), e.g. for the docs."""
        return sorted(k for k, obj in self._loaded().items() if _is_builtin(getattr(obj, "__module__", None)))


def _is_builtin(module: str | None) -> bool:
    return (module or "").split(".")[0] in ("rlkit", "rlkit_cli")


def _is_plugin_module(module: str | None) -> bool:
    return bool(module) and not _is_builtin(module) and module not in ("__main__", "builtins")


def extension_modules() -> list[str]:
    """Modules (outside rlkit, importable by name) that registered an entry in any registry."""
    modules = {getattr(obj, "__module__", None) for reg in _ALL for obj in reg._items.values()}
    return sorted(m for m in modules if _is_plugin_module(m))  # type: ignore[misc]


def import_plugins(modules: Iterable[str], strict: bool = True, key: str = "trainer.plugins") -> None:
    """Import plugin modules so their registrations run; the current directory is searched as `python -m` does.

    strict: a module that fails to import is a UserError naming `key`; otherwise (in workers, where the
    driver's list may name a module only the driver can import) a logged warning.
    """
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as exc:  # a plugin may fail in any way; say which and why
            if strict:
                raise UserError(f"{key}: cannot import '{module}' ({type(exc).__name__}: {exc}); "
                                "name an importable module (dotted name, found from the current directory)") from None
            log.warning("plugin module %s not imported in this worker: %s: %s", module, type(exc).__name__, exc)
