"""The training prompts as one endless stream: the loader's batches epoch after epoch, with a look ahead for the
rollout modes that start the next generation before the current step ends."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from rlkit.protocol import Batch


class PromptStream:
    """The training loader's batches, epoch after epoch; `peek` fetches the next one early (the same batch
    `next` returns after it)."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader
        self._epochs = self._forever()
        self._ahead: list[Batch] = []

    def _forever(self) -> Iterator[Batch]:
        while True:
            yield from self.loader

    def __iter__(self) -> PromptStream:
        return self

    def __next__(self) -> Batch:
        return self._ahead.pop(0) if self._ahead else next(self._epochs)

    def peek(self) -> Batch:
        if not self._ahead:
            self._ahead.append(next(self._epochs))
        return self._ahead[0]
