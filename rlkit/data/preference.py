"""Preference pairs: parquet rows (`prompt`, `chosen`, `rejected`) -> tokenized (prompt, chosen, rejected) triples.

A row's prompt is a string (one user turn) or a list of {role, content} messages; chosen and rejected
are strings or lists of assistant messages (TRL's standard and conversational formats). The prompt is
rendered with the chat template and the generation prompt, as the policy sees it when it samples; a
completion is what the template adds after that prefix for the reply (content + end of turn), so the
pair scores exactly the tokens a rollout would have produced. A batch of B pairs travels as 2B rows in
the RL layout (`prompts`, `responses`, `response_mask`, `input_ids`, ...): the chosen rows first, then
the rejected rows, so the actor's and the reference's log-prob passes read it as they read a rollout.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from rlkit.data.collation import left_pad
from rlkit.data.dataset import PathLike, expand_files
from rlkit.data.schema import ROLES, Problem, data_columns, read_table
from rlkit.errors import UserError
from rlkit.protocol import Batch
from rlkit.utils.tokens import pad_token_id

log = logging.getLogger(__name__)

PREFERENCE_COLUMNS = ("prompt", "chosen", "rejected")
SIDES = ("chosen", "rejected")


def is_preference_table(table: pa.Table) -> bool:
    """A file is read as preference pairs when it has both completion columns."""
    return all(c in data_columns(table) for c in SIDES)


# ------------------------------------------------------------------ validation
def _messages(value: Any) -> list[dict[str, Any]] | None:
    """A string or a message list as messages (None for anything else)."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if isinstance(value, list) and all(isinstance(m, dict) for m in value):
        return [{k: v for k, v in m.items() if v is not None or k in ("role", "content")} for m in value]
    return None


def _prompt_problems(row: int, value: Any) -> list[Problem]:
    messages = _messages(value)
    if messages is None:
        return [Problem(row, "prompt", 'expected a string or a list of {"role", "content"} messages')]
    if not messages or all(not (m.get("content") or "").strip() for m in messages):
        return [Problem(row, "prompt", "is empty; every pair needs the prompt both completions answer")]
    return [Problem(row, f"prompt[{j}].role", f"unknown role {m.get('role')!r}; use one of {', '.join(ROLES)}")
            for j, m in enumerate(messages) if m.get("role") not in ROLES]


def _side_problems(row: int, side: str, value: Any) -> list[Problem]:
    if isinstance(value, str):
        return [] if value.strip() else [Problem(row, side, "is empty; drop the row or give both completions")]
    messages = _messages(value)
    if messages is None:
        return [Problem(row, side, 'expected a string or a list of {"role": "assistant", "content"} messages')]
    if not messages or all(not (m.get("content") or "").strip() for m in messages):
        return [Problem(row, side, "is empty; drop the row or give both completions")]
    return [Problem(row, f"{side}[{j}].role", f"is {m.get('role')!r}; {side} holds the assistant's reply only "
                    "(put earlier turns in prompt)") for j, m in enumerate(messages) if m.get("role") != "assistant"]


def validate_preference_table(table: pa.Table) -> list[Problem]:
    """Every problem of a preference file, with its row and column (as `rlkit.data.schema.validate_table`)."""
    columns = data_columns(table)
    problems = [Problem(None, c, f"column is missing; a preference file has {', '.join(PREFERENCE_COLUMNS)}")
                for c in PREFERENCE_COLUMNS if c not in columns]
    if table.num_rows == 0:
        problems.append(Problem(None, None, "file has no rows; regenerate it or drop it from the file list"))
    if problems:
        return problems
    for row, record in enumerate(table.select(list(PREFERENCE_COLUMNS)).to_pylist()):
        problems.extend(_prompt_problems(row, record["prompt"]))
        for side in SIDES:
            problems.extend(_side_problems(row, side, record[side]))
    return problems


def _reply(value: Any) -> list[dict[str, Any]]:
    """A validated completion as assistant messages."""
    return [{"role": "assistant", "content": value}] if isinstance(value, str) else _messages(value) or []


# ------------------------------------------------------------------ tokenization
@dataclass(frozen=True)
class Pair:
    prompt: np.ndarray  # int32 token ids, chat-templated with the generation prompt
    chosen: np.ndarray
    rejected: np.ndarray


class PreferenceDataset:
    """Pairs from one or more parquet files, validated, chat-templated and tokenized at load time.

    Prompts over `max_prompt_length` tokens keep their end (the question is usually last), completions
    over `max_response_length` keep their start; both are counted and logged.
    """

    def __init__(self, files: PathLike | Sequence[PathLike], tokenizer: Any, max_prompt_length: int = 512,
                 max_response_length: int = 512, chat_template: str | None = None,
                 max_samples: int | None = None) -> None:
        self.tokenizer = tokenizer
        self.max_prompt_length = int(max_prompt_length)
        self.max_response_length = int(max_response_length)
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
            for record in table.select(list(PREFERENCE_COLUMNS)).to_pylist():
                self.pairs.append(self._tokenize(record))
        if self.num_truncated:
            log.warning("cut %d pairs to max_prompt_length=%d / max_response_length=%d tokens",
                        self.num_truncated, self.max_prompt_length, self.max_response_length)

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

    def _tokenize(self, record: dict[str, Any]) -> Pair:
        prompt = _messages(record["prompt"]) or []
        prompt_text = self._render(prompt, generation_prompt=True)
        prompt_ids = self._ids(prompt_text)
        sides = [self._completion(prompt, prompt_text, _reply(record[s])) for s in SIDES]
        if len(prompt_ids) > self.max_prompt_length or any(len(s) > self.max_response_length for s in sides):
            self.num_truncated += 1
        prompt_ids = prompt_ids[-self.max_prompt_length:]
        chosen, rejected = (np.asarray(s[: self.max_response_length], dtype=np.int32) for s in sides)
        return Pair(np.asarray(prompt_ids, dtype=np.int32), chosen, rejected)

    def __len__(self) -> int:
        return len(self.pairs)

    def get_batch(self, indices: Sequence[int] | np.ndarray) -> Batch:
        """Pairs at `indices` as 2B rows in the RL layout: chosen rows first, then rejected (see module doc)."""
        chosen = [self.pairs[int(i)] for i in indices]
        return pairs_batch(chosen, self.pad_token_id)


def pairs_batch(pairs: Sequence[Pair], pad_id: int) -> Batch:
    """2B rows: prompt left-padded to the longest prompt, completions right-padded to the longest completion."""
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
    return Batch({
        "prompts": prompt_ids,
        "responses": response_ids,
        "response_mask": response_mask,
        "input_ids": torch.cat([prompt_ids, response_ids], dim=1),
        "attention_mask": torch.cat([prompt_mask, response_mask], dim=1),
        "position_ids": torch.cat([prompt_pos, response_pos], dim=1),
    })


def split_sides(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(2B, ...) rows of a pairs batch -> (chosen (B, ...), rejected (B, ...))."""
    half = values.shape[0] // 2
    return values[:half], values[half:]


def read_preference_table(path: str | Path) -> pa.Table:
    """A preference file, refused with its first problem (one line naming the row and column) when invalid."""
    table = read_table(path)
    errors = [p for p in validate_preference_table(table) if p.is_error]
    if errors:
        more = f" (and {len(errors) - 1} more; see `rlkit data inspect {path}`)" if len(errors) > 1 else ""
        raise UserError(f"{path}: {errors[0]}{more}")
    return table
