"""A conversation rendered with the model's chat template, and which of its tokens the SFT loss covers.

The rule (docs/sft.md): the model trains on the text of the whole conversation as the template renders it once
(`F`), and the loss covers exactly the text each assistant turn adds there, its end-of-turn marker included.

For assistant turn i the template is asked twice: `G` = the turns before it with the generation prompt, `H` = the
turns up to and including it. The turn's own text is `H` after its common prefix with `G`. When `F` starts with
`H` (the usual case) that text sits in `F` at the same place. A template may rewrite earlier turns once later
ones exist, shortening them (Qwen3 drops the reasoning of past assistant turns): then the turn's text is aligned
by a character diff of `H` against the first len(H) characters of `F`, and only the characters of the turn that
`F` still holds count (the reasoning the final rendering drops is not trained; what it keeps is). Tokens are
mapped from characters with the tokenizer's offsets: a token is trained when its last character belongs to an
assistant turn.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class Rendered:
    """One conversation as token ids and its loss mask (1 = an assistant token)."""

    input_ids: np.ndarray  # (L,) int64
    loss_mask: np.ndarray  # (L,) int8


class NoAssistantTurn(ValueError):
    """The conversation has nothing to train on."""


def render_text(tokenizer: Any, messages: Sequence[Mapping[str, Any]], tools: Any = None,
                add_generation_prompt: bool = False, **template_kwargs: Any) -> str:
    kwargs = dict(template_kwargs)
    if tools:
        kwargs["tools"] = tools
    return tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=add_generation_prompt,
                                         **kwargs)


def assistant_spans(tokenizer: Any, messages: Sequence[Mapping[str, Any]], full: str, tools: Any = None,
                    **template_kwargs: Any) -> list[tuple[int, int]]:
    """Character spans of `full` (the whole conversation rendered) that the assistant turns add (the module rule)."""
    spans: list[tuple[int, int]] = []
    for i, msg in enumerate(messages):
        if msg.get("role") != "assistant":
            continue
        before = render_text(tokenizer, messages[:i], tools, add_generation_prompt=True, **template_kwargs)
        upto = render_text(tokenizer, messages[: i + 1], tools, **template_kwargs)
        start = len(os.path.commonprefix([before, upto]))
        if full.startswith(upto):
            spans.append((start, len(upto)))
            continue
        # the rewritten conversation up to this turn is no longer than `upto`: align within that window, so the
        # turn's text cannot match a later turn of `full`
        matcher = difflib.SequenceMatcher(None, upto, full[: len(upto)], autojunk=False)
        for a, b, size in matcher.get_matching_blocks():
            lo, hi = max(a, start), a + size
            if hi > lo:
                spans.append((b + lo - a, b + size))
    return spans


def render_conversation(tokenizer: Any, messages: Sequence[Mapping[str, Any]], tools: Any = None,
                        **template_kwargs: Any) -> Rendered:
    """The conversation's token ids and loss mask; raises NoAssistantTurn when no turn is the assistant's."""
    if not any(m.get("role") == "assistant" for m in messages):
        raise NoAssistantTurn("no assistant turn")
    full = render_text(tokenizer, messages, tools, **template_kwargs)
    enc = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    chars = np.zeros(len(full) + 1, dtype=bool)
    for lo, hi in assistant_spans(tokenizer, messages, full, tools, **template_kwargs):
        chars[lo:hi] = True
    ids = np.asarray(enc["input_ids"], dtype=np.int64)
    mask = np.array([bool(hi > lo and chars[hi - 1]) for lo, hi in enc["offset_mapping"]], dtype=np.int8)
    return Rendered(ids, mask)
