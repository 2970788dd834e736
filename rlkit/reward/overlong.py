"""DAPO's overlong penalty of a batch, read from either of its two config spellings.

`reward_model.overlong_buffer` (rlkit, and verl's DAPO recipe) shapes the rewards after scoring, with any
reward manager, up to `data.max_response_length`; `reward_model.reward_kwargs.overlong_buffer_cfg` with
`reward_kwargs.max_resp_len` (verl's `dapo` reward manager) adds it to the score itself. Both are one
`OverlongBuffer` and one formula (`rlkit.algo.dapo.overlong_reward_shaping`); a run turns on one of them.

A response's length is its tokens up to its last valid one (tool tokens in between count: they use up
the same length budget), as verl counts the response part of the attention mask.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import torch

from rlkit.algo.dapo import overlong_reward_shaping
from rlkit.errors import UserError
from rlkit.reward.placement import response_lengths

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OverlongBuffer:
    """{enable, len, penalty_factor, log}: a linear penalty over the last `len` tokens before the limit, down to
    -penalty_factor at it; `log` adds the per-sample columns `reward_extra/overlong_reward` and
    `reward_extra/overlong` (verl's names)."""

    enable: bool = False
    len: int = 0
    penalty_factor: float = 1.0
    log: bool = False

    @classmethod
    def parse(cls, value: Mapping[str, Any] | None, key: str) -> OverlongBuffer:
        """The buffer a config mapping describes; a UserError names `key` for an unknown or bad entry."""
        if value is None:
            return cls()
        if not isinstance(value, Mapping):
            raise UserError(f"{key} must be a mapping {{enable, len, penalty_factor, log}}, got {value!r}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise UserError(f"{key}.{unknown[0]} is not an overlong buffer option; options: {', '.join(sorted(known))}")
        try:
            buf = cls(enable=bool(value.get("enable", False)), len=int(value.get("len", 0)),
                      penalty_factor=float(value.get("penalty_factor", 1.0)), log=bool(value.get("log", False)))
        except (TypeError, ValueError) as exc:
            raise UserError(f"{key}: {exc}; e.g. {{enable: true, len: 64, penalty_factor: 1.0}}") from None
        if buf.enable and buf.len <= 0:
            raise UserError(f"{key}.len={buf.len} must be > 0 when {key}.enable is true")
        if buf.penalty_factor < 0:
            raise UserError(f"{key}.penalty_factor={buf.penalty_factor} must be >= 0")
        return buf

    def check_length(self, max_resp_len: int, key: str) -> None:
        """verl's warning (not an error) for a buffer longer than the response limit."""
        if self.enable and self.len > max_resp_len:
            log.warning("%s.len=%d is longer than the response limit %d: every response is penalized; shorten the "
                        "buffer or raise the limit", key, self.len, max_resp_len)

    def penalty(self, response_mask: torch.Tensor, max_resp_len: int) -> torch.Tensor:
        """(B,) float32: each row's penalty (0 when off)."""
        if not self.enable:
            return torch.zeros(response_mask.shape[0], dtype=torch.float32)
        lengths = torch.tensor(response_lengths(response_mask), dtype=torch.float32)
        return overlong_reward_shaping(lengths, max_resp_len, self.len, self.penalty_factor)

    def extras(self, penalty: torch.Tensor) -> dict[str, list[Any]]:
        """The per-sample columns `log` asks for (none otherwise)."""
        if not (self.enable and self.log):
            return {}
        values = penalty.tolist()
        return {"reward_extra/overlong_reward": values, "reward_extra/overlong": [v < 0 for v in values]}
