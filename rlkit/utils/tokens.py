"""The pad id of a tokenizer, read one way everywhere (prompts, responses, rollout outputs)."""

from __future__ import annotations

from typing import Any

from rlkit.errors import UserError


def first_id(value: Any) -> int | None:
    """A token id attribute as one int: the first of a list, None when unset (or an empty list)."""
    if isinstance(value, (list, tuple)):
        value = value[0] if value else None
    return None if value is None else int(value)


def pad_token_id(tokenizer: Any, *fallbacks: Any, where: str = "tokenizer") -> int:
    """`tokenizer.pad_token_id`, else the first of `fallbacks` that is set, else the tokenizer's EOS (its first,
    when it has several); UserError naming `where` when none is. Many chat tokenizers have no pad token:
    padding with the EOS is safe because every padded position is masked out."""
    for value in (getattr(tokenizer, "pad_token_id", None), *fallbacks, getattr(tokenizer, "eos_token_id", None)):
        pad = first_id(value)
        if pad is not None:
            return pad
    raise UserError(f"{where} has neither a pad nor an eos token; set one (tokenizer.pad_token)")
