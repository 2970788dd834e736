"""Where a response's reward lives: on its last valid response token. Written once, used by every
reward manager, by reward shaping and by `rlkit eval`.

"Valid" is `response_mask == 1`: tool and user tokens between model turns (mask 0) end no
response, so the score lands on the model's last token and the text scored runs up to it
(tool output in between included). A response with no valid token has its score on position 0.
"""

from __future__ import annotations

from typing import Any

import torch


def last_valid_index(mask: torch.Tensor) -> torch.Tensor:
    """(B,) long: the index of each row's last valid token (0 when the row has none)."""
    mask = mask.to(torch.long).cpu()
    positions = torch.arange(mask.shape[-1])
    return (mask * positions).argmax(dim=-1)


def response_lengths(mask: torch.Tensor) -> list[int]:
    """Tokens up to and including the last valid one (0 for a row with none)."""
    mask = mask.cpu()
    return torch.where(mask.any(dim=-1), last_valid_index(mask) + 1, 0).tolist()


def decode_responses(tokenizer: Any, responses: torch.Tensor, mask: torch.Tensor) -> list[str]:
    """Each response decoded up to its last valid token, without special tokens."""
    ids = [row[:n] for row, n in zip(responses.cpu().tolist(), response_lengths(mask))]
    return tokenizer.batch_decode(ids, skip_special_tokens=True)


def on_last_token(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, R) float32 zeros with each row's value (B,) on its last valid token."""
    out = torch.zeros(mask.shape, dtype=torch.float32)
    out[torch.arange(mask.shape[0]), last_valid_index(mask)] = values.to(torch.float32).cpu()
    return out
