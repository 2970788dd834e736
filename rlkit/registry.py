"""A tiny name -> object registry, used for every pluggable piece (dispatch modes,
advantage estimators, losses, scorers, rollout backends, trackers, tools).

Callers look things up by the name written in the config; nobody branches on names.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from rlkit.errors import UserError

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

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

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            close = difflib.get_close_matches(name, self._items, n=3)
            hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
            raise UserError(f"unknown {self.kind} '{name}'. Known: {', '.join(sorted(self._items))}.{hint}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._items))

    def names(self) -> list[str]:
        return sorted(self._items)
