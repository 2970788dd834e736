"""What to do with a prompt longer than `max_prompt_length`: a registry of modes.

Each mode gets the token ids of one over-long prompt and returns the ids to keep,
or None to drop the row. `where` ("file row N") lets a mode name the culprit.
"""

from __future__ import annotations

from collections.abc import Callable

from rlkit.errors import UserError
from rlkit.registry import Registry

TruncationFn = Callable[[list[int], int, str], "list[int] | None"]
TRUNCATION: Registry[TruncationFn] = Registry("truncation mode")


@TRUNCATION.register("error")
def _error(ids: list[int], max_len: int, where: str) -> list[int] | None:
    raise UserError(
        f"{where}: prompt has {len(ids)} tokens, more than max_prompt_length={max_len}; "
        "raise max_prompt_length, set data.filter_overlong_prompts=true or truncation to filter, left, right or middle"
    )


@TRUNCATION.register("left")
def _left(ids: list[int], max_len: int, where: str) -> list[int] | None:
    """Keep the end: the question and the generation prompt the model continues from."""
    return ids[-max_len:]


@TRUNCATION.register("right")
def _right(ids: list[int], max_len: int, where: str) -> list[int] | None:
    return ids[:max_len]


@TRUNCATION.register("middle")
def _middle(ids: list[int], max_len: int, where: str) -> list[int] | None:
    """Keep the head (system prompt, instructions) and the tail (question, generation prompt); the head gets
    max_len // 2 tokens, the tail the rest."""
    head = max_len // 2
    return ids[:head] + ids[len(ids) - (max_len - head) :]


@TRUNCATION.register("filter")
def _filter(ids: list[int], max_len: int, where: str) -> list[int] | None:
    return None
