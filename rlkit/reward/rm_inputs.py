"""What a classifier reward model reads: one token list per sample, packed right-padded, score on the last token.

Two ways in (`reward_model.model.input_tokenizer`):

- `policy_token_rows`: the RM shares the policy's tokenizer and chat template; each row is the
  policy's own tokens (prompt + response, padding dropped) up to the last valid response token.
- `retemplated_rows`: the RM was trained on another tokenizer or chat template; each response is
  decoded with the policy's tokenizer, appended to the prompt messages as the assistant turn, rendered
  with the RM's chat template and re-tokenised with the RM's tokenizer (what the RM saw in training).

Truncation (`max_length`): a row longer than `max_length` keeps its last `max_length` tokens (left
truncation): the start of the prompt goes first; the response's end, where the score is read, stays.
Pure functions over tensors and tokenizers: unit-tested without a model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rlkit.errors import UserError
from rlkit.reward.placement import decode_responses, last_valid_index

Message = Mapping[str, Any]


@dataclass
class RMInputs:
    """Right-padded model inputs; `last` is each row's last real token (where its score is read)."""

    input_ids: torch.Tensor  # (B, L)
    attention_mask: torch.Tensor  # (B, L)
    position_ids: torch.Tensor  # (B, L)
    last: torch.Tensor  # (B,) long

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def rows(self, start: int, end: int) -> RMInputs:
        """Rows start:end, trimmed to their longest row (micro-batches carry no all-pad columns)."""
        width = int(self.last[start:end].max()) + 1 if end > start else 0
        return RMInputs(
            self.input_ids[start:end, :width],
            self.attention_mask[start:end, :width],
            self.position_ids[start:end, :width],
            self.last[start:end],
        )


def truncate_left(ids: Sequence[int], max_length: int | None) -> list[int]:
    """The last `max_length` tokens (all of them when max_length is None or the row fits)."""
    ids = list(ids)
    return ids[-max_length:] if max_length is not None and len(ids) > max_length else ids


def pack(rows: Sequence[Sequence[int]], pad_token_id: int) -> RMInputs:
    """Token lists -> right-padded (B, L) tensors, positions from 0, `last` = length - 1."""
    if any(len(r) == 0 for r in rows):
        raise ValueError("reward model input: a row has no token")
    width = max((len(r) for r in rows), default=0)
    ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(list(r), dtype=torch.long)
        mask[i, : len(r)] = 1
    positions = torch.arange(width).expand(len(rows), width) * mask
    lengths = torch.tensor([len(r) for r in rows], dtype=torch.long)
    return RMInputs(ids, mask, positions.clone(), lengths - 1)


def policy_token_rows(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, response_mask: torch.Tensor, max_length: int | None = None
) -> list[list[int]]:
    """Each row's attended tokens (left-padded prompt + response) up to its last valid response token; a
    response without a valid token ends at the prompt's last token."""
    response_length = response_mask.shape[1]
    prompt_length = input_ids.shape[1] - response_length
    has = response_mask.bool().any(-1)
    ends = torch.where(has, prompt_length + last_valid_index(response_mask), prompt_length - 1)
    rows = []
    for ids, mask, end in zip(input_ids.tolist(), attention_mask.tolist(), ends.tolist()):
        rows.append(truncate_left([t for t, m in zip(ids[: end + 1], mask[: end + 1]) if m], max_length))
    return rows


def chat_messages(prompt: Any) -> list[dict[str, Any]]:
    """A prompt as chat messages: a list of {role, content} as it is, a string as one user message."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if hasattr(prompt, "tolist"):  # a numpy array of messages (parquet round trip)
        prompt = prompt.tolist()
    if isinstance(prompt, Sequence) and all(isinstance(m, Mapping) and "role" in m for m in prompt):
        return [dict(m) for m in prompt]
    raise UserError(
        f"reward model: a prompt must be a string or a list of {{role, content}} messages, got {type(prompt).__name__}"
    )


def render_for_rm(rm_tokenizer: Any, prompt: Any, response: str) -> str:
    """The RM's chat template over the prompt messages + the response as the assistant turn."""
    if not getattr(rm_tokenizer, "chat_template", None):
        raise UserError(
            "reward_model.model.input_tokenizer is set but the reward model's tokenizer has no chat "
            "template to apply; give the RM folder a chat_template or set input_tokenizer=null"
        )
    chat = chat_messages(prompt) + [{"role": "assistant", "content": response}]
    return rm_tokenizer.apply_chat_template(chat, tokenize=False)


def text_rows(
    rm_tokenizer: Any, prompts: Sequence[Any], responses: Sequence[str], max_length: int | None = None
) -> list[list[int]]:
    """Prompt messages + response texts -> the RM's tokens (its template carries the special tokens)."""
    rows = []
    for prompt, response in zip(prompts, responses):
        text = render_for_rm(rm_tokenizer, prompt, response)
        rows.append(truncate_left(rm_tokenizer(text, add_special_tokens=False)["input_ids"], max_length))
    return rows


def retemplated_rows(
    input_tokenizer: Any,
    rm_tokenizer: Any,
    raw_prompts: Sequence[Any],
    responses: torch.Tensor,
    response_mask: torch.Tensor,
    max_length: int | None = None,
) -> list[list[int]]:
    """Decode the policy's responses (up to the last valid token, no special tokens), re-apply the RM's chat
    template to raw_prompt + response, re-tokenise with the RM's tokenizer."""
    texts = decode_responses(input_tokenizer, responses, response_mask)
    return text_rows(rm_tokenizer, raw_prompts, texts, max_length)


__all__ = [
    "RMInputs",
    "chat_messages",
    "pack",
    "policy_token_rows",
    "render_for_rm",
    "retemplated_rows",
    "text_rows",
    "truncate_left",
]
