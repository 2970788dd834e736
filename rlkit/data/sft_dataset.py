"""The SFT dataset: rows of conversations (parquet, .jsonl or .json) -> token ids and the assistant-only loss mask.

A file holds multi-turn conversations (the `data.messages_key` column: lists of {role, content}, with an optional
`data.tools_key` column of tool schemas and `data.enable_thinking_key`), or single-turn `data.prompt_key` /
`data.response_key` columns (strings, chat message lists for the prompt, or dicts read by `prompt_dict_keys` /
`response_dict_keys`, verl's fsdp_sft_trainer layout; TRL's `prompt`/`completion` too, the completion a string or
assistant messages) that become user and assistant turns, or TRL's `text` column (plain language modeling: every
token a target, no chat template). Conversations are rendered with the model's chat template (rlkit.data.chat_mask:
the mask rule). A batch is right-padded rows plus the targets the SFT worker reads (rlkit/workers/sft_worker.py).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlkit.data.chat_mask import NoAssistantTurn, render_conversation
from rlkit.data.dataset import PathLike, _clean_message, expand_files
from rlkit.data.schema import data_columns, read_table
from rlkit.errors import UserError
from rlkit.protocol import Batch
from rlkit.utils.tokens import pad_token_id

logger = logging.getLogger(__name__)

TRL_COMPLETION = "completion"  # TRL's prompt-completion column, read when the file has no data.response_key column
TRL_TEXT = "text"  # TRL's standard language-modeling column


class SFTDataset:
    """Conversations from parquet files, rendered and masked once. `data`: the SFT config's data section."""

    def __init__(self, files: PathLike | Sequence[PathLike], tokenizer: Any, data: Any,
                 max_samples: int | None = None, thinking_default: bool | None = None) -> None:
        self.files = expand_files(files)
        self.tokenizer, self.data = tokenizer, data
        self.thinking_default = thinking_default
        if not getattr(tokenizer, "chat_template", None):
            raise UserError(f"tokenizer {getattr(tokenizer, 'name_or_path', '')!r} has no chat template; SFT renders "
                            "conversations with it: use a chat/instruct model's tokenizer")
        if not getattr(tokenizer, "is_fast", False):
            raise UserError("SFT needs a fast tokenizer (character offsets map the assistant text to tokens); "
                            "install `tokenizers` and use the model's tokenizer.json")
        self.pad_token_id = pad_token_id(tokenizer)
        self._ids: list[np.ndarray] = []
        self._masks: list[np.ndarray] = []
        self.num_truncated = self.num_dropped = 0
        seen = 0
        for path in self.files:
            if max_samples is not None and seen >= max_samples:
                break
            table = read_table(path)
            if max_samples is not None:
                table = table.slice(0, max_samples - seen)
            self._load(table, path)
            seen += table.num_rows
        if self.num_truncated:
            logger.warning("cut %d conversations to data.max_length=%d tokens (truncation=%s); dropped %d left "
                           "with no assistant token", self.num_truncated, data.max_length, data.truncation,
                           self.num_dropped)
        if not self._ids:
            raise UserError(f"{', '.join(map(str, self.files))}: no conversation to train on")

    # ------------------------------------------------------------------ loading
    def _load(self, table: Any, path: Path) -> None:
        d = self.data
        names = data_columns(table)
        layout = sft_layout(names, d)
        if layout is None:
            raise UserError(f"{path}: {no_layout_message(names, d)}")
        kind, columns = layout
        if kind == "text":  # TRL's standard language modeling: every token of the text is a target
            for row, text in enumerate(table.column(TRL_TEXT).to_pylist()):
                ids = self._text_ids(text, path, row)
                self._keep(ids, np.ones_like(ids), path, row)
            return
        if kind == "messages":
            convs = [[_message(m) for m in row or []] for row in table.column(columns[0]).to_pylist()]
        else:
            prompts, responses = (table.column(c).to_pylist() for c in columns)
            convs = [single_turn(p, r, d.prompt_dict_keys, d.response_dict_keys, path, i)
                     for i, (p, r) in enumerate(zip(prompts, responses))]
        what = "column " + "/".join(f"'{c}'" for c in columns)
        tools = table.column(d.tools_key).to_pylist() if d.tools_key in names else [None] * len(convs)
        thinking = (table.column(d.enable_thinking_key).to_pylist() if d.enable_thinking_key in names
                    else [None] * len(convs))
        for row, (messages, row_tools, think) in enumerate(zip(convs, tools, thinking)):
            kwargs = dict(d.apply_chat_template_kwargs)
            think = self.thinking_default if think is None else bool(think)
            if think is not None:
                kwargs["enable_thinking"] = think
            try:
                r = render_conversation(self.tokenizer, messages, _tools(row_tools, path, row), **kwargs)
            except NoAssistantTurn:
                raise UserError(f"{path} row {row}: the conversation in {what} has no assistant turn; every row "
                                "needs at least one {role: assistant} message to train on") from None
            self._keep(r.input_ids, r.loss_mask, path, row)

    def _text_ids(self, text: Any, path: Path, row: int) -> np.ndarray:
        """A plain text's tokens (the tokenizer's special tokens, and EOS at the end, as TRL's SFT adds it)."""
        if not isinstance(text, str) or not text.strip():
            raise UserError(f"{path} row {row}: column '{TRL_TEXT}' is empty or not a string; every row needs the text "
                            "to train on")
        ids = list(self.tokenizer(text)["input_ids"])
        eos = getattr(self.tokenizer, "eos_token_id", None)
        if eos is not None and (not ids or ids[-1] != eos):
            ids.append(eos)
        return np.asarray(ids, dtype=np.int64)

    def _keep(self, ids: np.ndarray, mask: np.ndarray, path: Path, row: int) -> None:
        d = self.data
        if len(ids) > d.max_length:
            if d.truncation == "error":
                raise UserError(f"{path} row {row}: {len(ids)} tokens > data.max_length={d.max_length}; raise "
                                "data.max_length or set data.truncation=right (or left)")
            cut = slice(0, d.max_length) if d.truncation == "right" else slice(len(ids) - d.max_length, None)
            ids, mask = ids[cut], mask[cut]
            self.num_truncated += 1
        if not mask[1:].any():  # the first token is never a target
            self.num_dropped += 1
            return
        self._ids.append(ids)
        self._masks.append(mask)

    # ------------------------------------------------------------------ access
    def __len__(self) -> int:
        return len(self._ids)

    def row(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Token ids and loss mask of conversation i."""
        return self._ids[i], self._masks[i]

    @property
    def tokens(self) -> np.ndarray:
        """Each conversation's length in tokens."""
        return np.array([len(x) for x in self._ids])

    def get_batch(self, indices: Sequence[int] | np.ndarray) -> Batch:
        """Right-padded rows: input_ids, attention_mask, position_ids (b, S); responses = the targets
        input_ids[:, 1:] and response_mask (b, S-1) = which targets the loss covers."""
        rows = [int(i) for i in indices]
        length = max(len(self._ids[i]) for i in rows)
        ids = torch.full((len(rows), length), self.pad_token_id, dtype=torch.long)
        attn = torch.zeros((len(rows), length), dtype=torch.long)
        loss = torch.zeros((len(rows), length), dtype=torch.long)
        for k, i in enumerate(rows):
            n = len(self._ids[i])
            ids[k, :n] = torch.from_numpy(self._ids[i])
            attn[k, :n] = 1
            loss[k, :n] = torch.from_numpy(self._masks[i].astype(np.int64))
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        return Batch({"input_ids": ids, "attention_mask": attn, "position_ids": pos, "responses": ids[:, 1:],
                      "response_mask": loss[:, 1:] * attn[:, 1:]})


def sft_layout(names: Sequence[str], data: Any) -> tuple[str, tuple[str, ...]] | None:
    """How a file with columns `names` is read: ("messages", (column,)), ("single_turn", (prompt, completion)) or
    ("text", ("text",)); None when it has none of them."""
    if data.messages_key in names:
        return "messages", (data.messages_key,)
    completion = data.response_key if data.response_key in names else TRL_COMPLETION
    if data.prompt_key in names and completion in names:
        return "single_turn", (data.prompt_key, completion)
    if TRL_TEXT in names:
        return "text", (TRL_TEXT,)
    return None


def no_layout_message(names: Sequence[str], data: Any) -> str:
    return (f"no data.messages_key column '{data.messages_key}' (nor data.prompt_key/response_key '{data.prompt_key}'/"
            f"'{data.response_key}', TRL's prompt/completion or text); its columns are {list(names)}: set "
            "data.messages_key=<column> (or data.prompt_key/data.response_key)")


def single_turn(prompt: Any, response: Any, prompt_keys: Any, response_keys: Any, path: Path,
                row: int) -> list[dict[str, Any]]:
    """verl's single-turn row as a conversation: the prompt (a string, a message list or a dict read by
    `prompt_keys`) as the user's turn(s), the response as the assistant's."""
    if isinstance(prompt, list):
        messages = [_clean_message(m) for m in prompt]
    else:
        messages = [{"role": "user", "content": _text(prompt, prompt_keys, "prompt", path, row)}]
    if isinstance(response, list):  # a conversational completion: the assistant's message(s)
        return messages + [_message(m) for m in response]
    answer = _text(response, response_keys, "response", path, row)
    return messages + ([{"role": "assistant", "content": answer}] if answer else [])


def _text(value: Any, keys: Any, what: str, path: Path, row: int) -> str:
    if isinstance(value, Mapping):
        if not keys:
            raise UserError(f"{path} row {row}: the {what} column holds dicts; set data.{what}_dict_keys to the "
                            "keys whose text to use")
        return "".join(str(value.get(k, "")) for k in keys)
    return "" if value is None else str(value)


def _message(msg: Mapping[str, Any]) -> dict[str, Any]:
    """A stored message as the chat template takes it: absent fields dropped, tool calls stored as JSON decoded."""
    out = _clean_message(msg)
    if isinstance(out.get("tool_calls"), str):
        out["tool_calls"] = json.loads(out["tool_calls"])
    return out


def _tools(value: Any, path: Path, row: int) -> Any:
    """A row's tool schemas: a list of dicts, or a JSON string of one (null = none)."""
    if value is None or isinstance(value, list):
        return value or None
    try:
        return json.loads(value) or None
    except (TypeError, json.JSONDecodeError):
        raise UserError(f"{path} row {row}: the tools column is not a list of tool schemas nor JSON of one") from None
