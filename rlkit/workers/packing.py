"""Remove-padding: the valid tokens of a micro-batch laid end to end in one (1, T) row, and back.

The row carries its sequence boundaries as cumulative lengths (`cu_seqlens`), which the varlen
attention (rlkit/workers/varlen_attention.py) reads instead of a (T x T) mask. Under sequence
parallelism the row is padded at the end to a multiple of the group size; the padding is a
sequence of its own (it attends only to itself and nothing reads its outputs).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PackedRow:
    valid: torch.Tensor  # (b, L) bool: the packed tokens, row-major
    input_ids: torch.Tensor  # (1, Tp)
    position_ids: torch.Tensor  # (1, Tp)
    cu_seqlens: torch.Tensor  # (n + 1,) int32, the last entry Tp
    max_len: int  # longest segment
    tokens: int  # T valid tokens; Tp - T padding at the end

    @classmethod
    def pack(
        cls,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        multiple_of: int = 1,
        pad_id: int = 0,
    ) -> PackedRow:
        valid = attention_mask.bool()
        lengths = valid.sum(1)
        lengths = lengths[lengths > 0]
        tokens = int(lengths.sum())
        pad = -tokens % multiple_of
        ids, pos = _pad_end(input_ids[valid], pad, pad_id), position_ids[valid]
        if pad:
            pos = torch.cat([pos, torch.arange(pad, dtype=pos.dtype, device=pos.device)])
            lengths = torch.cat([lengths, lengths.new_tensor([pad])])
        cu = torch.zeros(lengths.numel() + 1, dtype=torch.int32, device=ids.device)
        cu[1:] = lengths.cumsum(0)
        max_len = int(lengths.max()) if lengths.numel() else 0
        return cls(valid, ids.unsqueeze(0), pos.unsqueeze(0), cu, max_len, tokens)

    @property
    def length(self) -> int:
        """Tp, padding included."""
        return self.input_ids.shape[1]

    def index(self) -> torch.Tensor:
        """(b, L) long: each valid token's position in the packed row (meaningless elsewhere)."""
        return self.valid.reshape(-1).long().cumsum(0).view_as(self.valid) - 1

    def pack_tokens(self, per_token: torch.Tensor, fill: int | float) -> torch.Tensor:
        """(b, L, ...) per token -> (Tp, ...): the valid tokens as the ids are packed, `fill` on the end padding."""
        return _pad_end(per_token[self.valid], self.length - self.tokens, fill)

    def unpack(self, packed: torch.Tensor) -> torch.Tensor:
        """(Tp, ...) per packed position -> (b, L, ...), zeros at padding."""
        full = packed.new_zeros((*self.valid.shape, *packed.shape[1:]))
        full[self.valid] = packed[: self.tokens]
        return full


def _pad_end(packed: torch.Tensor, pad: int, fill: int | float) -> torch.Tensor:
    """(T, ...) -> (T + pad, ...), `fill` in the new rows."""
    return torch.cat([packed, packed.new_full((pad, *packed.shape[1:]), fill)]) if pad else packed


def response_targets(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, response_length: int, wanted: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Which logits matter: `need` (b, L), column c where c+1 is a valid response token (and, with `wanted`
    (b, R), one the caller asked for); `resp_need` (b, R), the same seen from the response columns; `labels` (K,),
    the predicted tokens, in row-major order of both."""
    length = input_ids.shape[1]
    need = torch.zeros_like(attention_mask, dtype=torch.bool)
    response = attention_mask[:, length - response_length :].bool()
    if wanted is not None:
        response = response & wanted.to(response.device).bool()
    need[:, length - response_length - 1 : length - 1] = response
    need &= attention_mask.bool()
    resp_need = need[:, length - response_length - 1 : length - 1]
    labels = input_ids[:, length - response_length :][resp_need]
    return need, resp_need, labels


def pack_mask(attention_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Additive block-diagonal causal (1, 1, T, T) mask (0 allowed, dtype's min elsewhere; sdpa and eager take
    it) for the valid tokens of each row laid end to end: the packed path of models the varlen attention
    cannot serve (quadratic in T)."""
    valid = attention_mask.bool()
    seq_id = torch.arange(attention_mask.shape[0], device=valid.device).unsqueeze(1).expand_as(valid)[valid]
    t = seq_id.shape[0]
    causal = torch.arange(t, device=valid.device)
    allowed = (seq_id[:, None] == seq_id[None, :]) & (causal[:, None] >= causal[None, :])
    mask = torch.zeros(allowed.shape, dtype=dtype, device=valid.device).masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None]


def trim_left_padding(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, response_length: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Drop the leading columns that are padding in every row (prompts are left-padded to the
    longest allowed prompt, usually much longer than this micro-batch's). Exact: those columns are
    masked out of attention; the response columns (counted from the end) are never touched."""
    first = left_padding_start(attention_mask, response_length)
    return input_ids[:, first:], attention_mask[:, first:], position_ids[:, first:]


def left_padding_start(attention_mask: torch.Tensor, response_length: int) -> int:
    """The first column some row uses (at most the last prompt column: the response's first logit stays)."""
    has_token = attention_mask.bool().any(0)
    first = int(has_token.int().argmax()) if bool(has_token.any()) else 0
    return min(first, max(0, attention_mask.shape[1] - response_length - 1))
