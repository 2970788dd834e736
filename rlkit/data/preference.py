"""Preference pairs: parquet rows (`prompt`, `chosen`, `rejected`; rlkit.data.preference_schema) -> tokenized
(prompt, chosen, rejected) triples and training batches.

The prompt is rendered with the chat template and the generation prompt, as the policy sees it when it samples; a
completion is what the template adds after that prefix for the reply (content + end of turn), so the
pair scores exactly the tokens a rollout would have produced. A batch of B pairs is B rows whose tensors hold
the chosen then the rejected sequence side by side (`pairs_batch`), so micro-batching keeps a pair together;
`as_sequences` unfolds them into 2B rows in the RL layout for the policy's and the reference's forward.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from rlkit.data.collation import left_pad
from rlkit.data.dataset import PathLike, expand_files
from rlkit.data.preference_schema import PREFERENCE_COLUMNS, SIDES, messages_of, read_preference_table, reply_of
from rlkit.errors import UserError
from rlkit.protocol import Batch
from rlkit.utils.tokens import pad_token_id

log = logging.getLogger(__name__)

#: what a policy forward reads of a pair row, per side
SEQUENCE_KEYS = ("input_ids", "attention_mask", "position_ids", "responses", "response_mask")


@dataclass(frozen=True)
class Pair:
    prompt: np.ndarray  # int32 token ids, chat-templated with the generation prompt
    chosen: np.ndarray
    rejected: np.ndarray


class PreferenceDataset:
    """Pairs from one or more parquet files, validated, chat-templated and tokenized at load time.

    A prompt over `max_prompt_length` tokens keeps its end (the question is usually last); a completion keeps its
    start, cut so that prompt + completion fit `max_length`. `truncation="error"` refuses such a pair instead,
    naming its file and row; other values cut, and the count is logged.
    """

    def __init__(self, files: PathLike | Sequence[PathLike], tokenizer: Any, max_prompt_length: int = 512,
                 max_length: int = 1024, truncation: str = "right", chat_template: str | None = None,
                 max_samples: int | None = None) -> None:
        self.tokenizer = tokenizer
        self.max_prompt_length = int(max_prompt_length)
        self.max_length = int(max_length)
        if not 0 < self.max_prompt_length < self.max_length:
            raise UserError(f"max_prompt_length={max_prompt_length} must be > 0 and below max_length={max_length} "
                            "(room for the completion)")
        self.truncation = truncation
        self.chat_template = chat_template or getattr(tokenizer, "chat_template", None)
        if not self.chat_template:
            raise UserError("the tokenizer has no chat template; use a chat model's tokenizer or set a chat_template")
        self.pad_token_id = pad_token_id(tokenizer)
        self.eos_token_id = getattr(tokenizer, "eos_token_id", None)
        self.pairs: list[Pair] = []
        self.num_truncated = 0
        for path in expand_files(files):
            if max_samples is not None and len(self.pairs) >= max_samples:
                break
            table = read_preference_table(path)
            if max_samples is not None:
                table = table.slice(0, max_samples - len(self.pairs))
            for row, record in enumerate(table.select(list(PREFERENCE_COLUMNS)).to_pylist()):
                self.pairs.append(self._tokenize(record, f"{path} row {row}"))
        if self.num_truncated:
            log.warning("cut %d pairs to max_prompt_length=%d / max_length=%d tokens", self.num_truncated,
                        self.max_prompt_length, self.max_length)

    def _render(self, messages: list[dict[str, Any]], generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt,
                                                  chat_template=self.chat_template)

    def _ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _completion(self, prompt: list[dict[str, Any]], prompt_text: str, reply: list[dict[str, Any]]) -> list[int]:
        """The tokens the template adds after the generation prompt (content + end of turn); when the template
        rewrites the prompt once a reply follows, the content and the EOS."""
        full = self._render(prompt + reply, generation_prompt=False)
        if full.startswith(prompt_text):
            return self._ids(full[len(prompt_text):])
        ids = self._ids("".join(m.get("content") or "" for m in reply))
        return ids + ([self.eos_token_id] if self.eos_token_id is not None else [])

    def _tokenize(self, record: dict[str, Any], where: str) -> Pair:
        prompt = messages_of(record["prompt"]) or []
        prompt_text = self._render(prompt, generation_prompt=True)
        prompt_ids = self._ids(prompt_text)
        sides = [self._completion(prompt, prompt_text, reply_of(record[s])) for s in SIDES]
        longest = len(prompt_ids) + max(len(s) for s in sides)
        if len(prompt_ids) > self.max_prompt_length or longest > self.max_length:
            if self.truncation == "error":
                raise UserError(f"{where}: prompt + completion take {longest} tokens (prompt {len(prompt_ids)}), "
                                f"over max_length={self.max_length} / max_prompt_length={self.max_prompt_length}; "
                                "raise them or set data.truncation=right to cut")
            self.num_truncated += 1
        prompt_ids = prompt_ids[-self.max_prompt_length:]
        room = self.max_length - len(prompt_ids)
        chosen, rejected = (np.asarray(s[:room], dtype=np.int32) for s in sides)
        return Pair(np.asarray(prompt_ids, dtype=np.int32), chosen, rejected)

    def __len__(self) -> int:
        return len(self.pairs)

    def get_batch(self, indices: Sequence[int] | np.ndarray) -> Batch:
        """Pairs at `indices`, one row each (see `pairs_batch`), with `pair_index` (B,): each row's place in the
        dataset, which keys what is stored per pair (the precomputed reference log-probs) across shuffles and epochs."""
        rows = [int(i) for i in indices]
        batch = pairs_batch([self.pairs[i] for i in rows], self.pad_token_id)
        batch["pair_index"] = torch.tensor(rows, dtype=torch.long)
        return batch


def pairs_batch(pairs: Sequence[Pair], pad_id: int) -> Batch:
    """One row per pair, so micro-batching never parts a pair: each tensor holds the chosen sequence then the
    rejected one along dim 1, both in the RL layout (prompt left-padded to the longest prompt, completion
    right-padded to the longest completion): `input_ids`, `attention_mask`, `position_ids` (B, 2S) and
    `responses`, `response_mask` (B, 2R). `as_sequences` turns it into 2B rows for a forward."""
    prompts = [p.prompt for p in pairs] * 2
    responses = [p.chosen for p in pairs] + [p.rejected for p in pairs]
    width = max(len(p) for p in prompts)
    prompt_ids, prompt_mask, prompt_pos = left_pad(prompts, width, pad_id)
    length = max(len(r) for r in responses)
    response_ids = torch.full((len(responses), length), pad_id, dtype=torch.long)
    response_mask = torch.zeros((len(responses), length), dtype=torch.long)
    for i, r in enumerate(responses):
        response_ids[i, : len(r)] = torch.from_numpy(r.astype(np.int64))
        response_mask[i, : len(r)] = 1
    response_pos = prompt_pos[:, -1:] + torch.arange(1, length + 1).unsqueeze(0)
    rows = {
        "responses": response_ids,
        "response_mask": response_mask,
        "input_ids": torch.cat([prompt_ids, response_ids], dim=1),
        "attention_mask": torch.cat([prompt_mask, response_mask], dim=1),
        "position_ids": torch.cat([prompt_pos, response_pos], dim=1),
    }
    return Batch({k: side_by_side(v) for k, v in rows.items()})


def side_by_side(rows: torch.Tensor) -> torch.Tensor:
    """(2B, L) rows, chosen first -> (B, 2L) pair rows: chosen ++ rejected."""
    chosen, rejected = rows.chunk(2)
    return torch.cat([chosen, rejected], dim=1)


def split_sides(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, 2L) pair rows -> (chosen (B, L), rejected (B, L))."""
    chosen, rejected = values.chunk(2, dim=1)
    return chosen, rejected


def as_sequences(pairs: Batch, keys: Sequence[str] = SEQUENCE_KEYS) -> Batch:
    """Pair rows -> 2B sequence rows in the RL layout (the b chosen first, then the b rejected), for a forward."""
    return Batch({k: torch.cat(split_sides(pairs[k]), dim=0) for k in keys})
