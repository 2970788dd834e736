"""The preference file format (`prompt`, `chosen`, `rejected`) and its validator, shared by `rlkit data inspect`,
`rlkit data pairs` and the DPO loader; no torch, so `rlkit data` stays light.

prompt: a string (one user turn) or a list of {role, content} messages; chosen / rejected: a string or a list
of assistant messages (TRL's standard and conversational formats). Without a prompt column the prompt is implicit
(TRL's "implicit prompt" preference format): the part both completions share at their start, messages for
conversations, text up to a word boundary for strings. Problems carry their row and column.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa

from rlkit.data.schema import ROLES, Problem, data_columns, read_table
from rlkit.errors import UserError

PREFERENCE_COLUMNS = ("prompt", "chosen", "rejected")
SIDES = ("chosen", "rejected")


def is_preference_table(table: pa.Table) -> bool:
    """A file is read as preference pairs when it has both completion columns."""
    return all(c in data_columns(table) for c in SIDES)


def messages_of(value: Any) -> list[dict[str, Any]] | None:
    """A string or a message list as messages (None for anything else)."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if isinstance(value, list) and all(isinstance(m, dict) for m in value):
        return [{k: v for k, v in m.items() if v is not None or k in ("role", "content")} for m in value]
    return None


def _prompt_problems(row: int, value: Any) -> list[Problem]:
    if value is None:
        return [Problem(row, "prompt", "is null; give a prompt column, or (implicit prompt) completions that start "
                        "alike: the same first messages or words")]
    messages = messages_of(value)
    if messages is None:
        return [Problem(row, "prompt", 'expected a string or a list of {"role", "content"} messages')]
    if not messages or all(not (m.get("content") or "").strip() for m in messages):
        return [Problem(row, "prompt", "is empty; every pair needs the prompt both completions answer")]
    return [Problem(row, f"prompt[{j}].role", f"unknown role {m.get('role')!r}; use one of {', '.join(ROLES)}")
            for j, m in enumerate(messages) if m.get("role") not in ROLES]


def _side_problems(row: int, side: str, value: Any) -> list[Problem]:
    if isinstance(value, str):
        return [] if value.strip() else [Problem(row, side, "is empty; drop the row or give both completions")]
    messages = messages_of(value)
    if messages is None:
        return [Problem(row, side, 'expected a string or a list of {"role": "assistant", "content"} messages')]
    if not messages or all(not (m.get("content") or "").strip() for m in messages):
        return [Problem(row, side, "is empty; drop the row or give both completions")]
    return [Problem(row, f"{side}[{j}].role", f"is {m.get('role')!r}; {side} holds the assistant's reply only "
                    "(put earlier turns in prompt)") for j, m in enumerate(messages) if m.get("role") != "assistant"]


def _shared_start(chosen: Any, rejected: Any) -> int:
    """How much of both completions' start is the same: messages of two conversations, characters of two strings
    (for strings, up to the last space before they part, so a word both only begin stays with the completions)."""
    n = 0
    while n < min(len(chosen), len(rejected)) and chosen[n] == rejected[n]:
        n += 1
    if isinstance(chosen, str) and " " in chosen[:n]:
        n = chosen.rindex(" ", 0, n)
    return n


def split_implicit_prompt(chosen: Any, rejected: Any) -> tuple[Any, Any, Any] | None:
    """(prompt, chosen, rejected) of an implicit-prompt pair; None when they share no start or one is all shared."""
    if type(chosen) is not type(rejected) or not isinstance(chosen, (str, list)) or chosen == rejected:
        return None
    n = _shared_start(chosen, rejected)
    if n == 0 or n >= len(chosen) or n >= len(rejected):
        return None
    return chosen[:n], chosen[n:], rejected[n:]


def with_prompts(table: pa.Table) -> pa.Table:
    """A preference table with its prompt column: the table itself, or the implicit prompts split off (rows that
    do not split keep a null prompt, which the validator reports with its row)."""
    columns = data_columns(table)
    if "prompt" in columns or not all(c in columns for c in SIDES):
        return table
    rows = []
    for record in table.select(list(SIDES)).to_pylist():
        split = split_implicit_prompt(record["chosen"], record["rejected"])
        prompt, chosen, rejected = split or (None, record["chosen"], record["rejected"])
        rows.append({"prompt": prompt, "chosen": chosen, "rejected": rejected})
    return pa.Table.from_pylist(rows)


def validate_preference_table(table: pa.Table) -> list[Problem]:
    """Every problem of a preference file, with its row and column (as `rlkit.data.schema.validate_table`)."""
    table = with_prompts(table)
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


def reply_of(value: Any) -> list[dict[str, Any]]:
    """A validated completion as assistant messages."""
    return [{"role": "assistant", "content": value}] if isinstance(value, str) else messages_of(value) or []


def read_preference_table(path: str | Path) -> pa.Table:
    """A preference file, refused with its first problem (one line naming the row and column) when invalid."""
    table = read_table(path)
    errors = [p for p in validate_preference_table(table) if p.is_error]
    if errors:
        more = f" (and {len(errors) - 1} more; see `rlkit data inspect {path}`)" if len(errors) > 1 else ""
        raise UserError(f"{path}: {errors[0]}{more}")
    return with_prompts(table)
