"""Say a thing once: the first time a key is seen, not on every step, sample or call that repeats it.

    _ONCE = Once()
    if _ONCE.first(key):
        log.warning(...)

One `Once` per kind of message (a module global: once per process; an attribute: once per object).
Thread-safe (reward scorers and agent episodes run on threads) and picklable (an object holding one goes
to Ray workers; the keys seen travel, the lock is made anew).
"""

from __future__ import annotations

import threading
from collections.abc import Hashable


class Once:
    """The keys seen so far; `first(key)` is True exactly once per key."""

    def __init__(self) -> None:
        self._seen: set[Hashable] = set()
        self._lock = threading.Lock()

    def first(self, key: Hashable = None) -> bool:
        with self._lock:
            if key in self._seen:
                return False
            self._seen.add(key)
            return True

    def __getstate__(self) -> dict:
        return {"seen": set(self._seen)}

    def __setstate__(self, state: dict) -> None:
        self._seen = set(state["seen"])
        self._lock = threading.Lock()
