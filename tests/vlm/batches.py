"""The rollout batch layout of the VLM tests' rows: prompts left-padded and responses right-padded, the widths
taken from every row (so any pick of them lines up column for column)."""

from __future__ import annotations

import torch

from rlkit.data.collation import left_pad


def padded_batch(rows: list, pad_id: int, pick: list[int] | None = None):
    """`rows` are (prompt ids, response ids, processor output); returns the picked rows' input ids, attention mask,
    positions and response mask (its width is the response length)."""
    prompt_len, resp_len = max(len(r[0]) for r in rows) + 2, max(len(r[1]) for r in rows) + 1
    chosen = rows if pick is None else [rows[i] for i in pick]
    p_ids, p_mask, p_pos = left_pad([r[0] for r in chosen], prompt_len, pad_id)
    responses = torch.full((len(chosen), resp_len), pad_id)
    r_mask = torch.zeros_like(responses)
    for i, (_, resp, _) in enumerate(chosen):
        responses[i, : len(resp)] = torch.tensor(resp)
        r_mask[i, : len(resp)] = 1
    pos = torch.cat([p_pos, p_pos[:, -1:] + torch.arange(1, resp_len + 1)], 1)
    return torch.cat([p_ids, responses], 1), torch.cat([p_mask, r_mask], 1), pos, r_mask
