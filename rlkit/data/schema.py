"""The common RL parquet schema, and one validator shared by `rlkit data inspect` and the loader.

Rows look like this (the layout other RL toolkits use too, so their files load as they are):

    data_source: str                 selects the reward scorer
    prompt: list[{role, content}]    chat messages
    ability: str
    reward_model: {style, ground_truth}
    extra_info: {split, index, ...}  free fields per dataset

An SFT file (`rlkit data gsm8k --format sft`, `rlkit data messages`) adds `messages: list[{role, content}]`, the
whole conversation (rlkit train sft reads it); a file of conversations alone is valid for SFT.

The validator reports every problem with its row and column, so a user fixes a file
in one pass instead of meeting the errors one at a time at training start-up.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from rlkit.errors import UserError

REQUIRED_COLUMNS = ("data_source", "prompt", "ability", "reward_model", "extra_info")
MESSAGES = "messages"  # the SFT conversations (optional; alone, the file is for `rlkit train sft` only)
ROLES = ("system", "user", "assistant", "tool")
#: written by pandas when a frame has a non-default index; never data
PANDAS_INDEX_PREFIX = "__index_level_"

MESSAGE_TYPE = pa.struct([("role", pa.string()), ("content", pa.string())])
PROMPT_TYPE = pa.list_(MESSAGE_TYPE)
REWARD_MODEL_TYPE = pa.struct([("style", pa.string()), ("ground_truth", pa.string())])
IMAGES_TYPE = pa.list_(pa.struct([("bytes", pa.binary()), ("path", pa.string())]))  # verl's `images` column
BASE_EXTRA_INFO_FIELDS = (pa.field("split", pa.string()), pa.field("index", pa.int64()))


def with_messages(schema: pa.Schema) -> pa.Schema:
    """`schema` plus the SFT `messages` column (the prompt and the reference answer as the assistant turn)."""
    return schema.append(pa.field(MESSAGES, PROMPT_TYPE))


def arrow_schema(extra_info_fields: Sequence[pa.Field] = (), images: bool = False) -> pa.Schema:
    """The exact schema `rlkit data` writes; datasets add their own `extra_info` fields, and an image dataset
    the `images` column (a list of {bytes, path} per row, verl's layout; rlkit/data/images.py)."""
    extra = pa.struct([*BASE_EXTRA_INFO_FIELDS, *extra_info_fields])
    return pa.schema(
        [
            ("data_source", pa.string()),
            ("prompt", PROMPT_TYPE),
            ("ability", pa.string()),
            ("reward_model", REWARD_MODEL_TYPE),
            ("extra_info", extra),
            *([("images", IMAGES_TYPE)] if images else []),
        ]
    )


@dataclass(frozen=True)
class Problem:
    """One finding. `row` is 0-based within the file; None means the whole column/file."""

    row: int | None
    column: str | None
    message: str
    severity: str = "error"  # or "warning": reported, but the file still loads

    @property
    def is_error(self) -> bool:
        return self.severity == "error"

    def __str__(self) -> str:
        where = [f"row {self.row}"] if self.row is not None else []
        if self.column is not None:
            where.append(f"column '{self.column}'")
        return f"{', '.join(where)}: {self.message}" if where else self.message


# ------------------------------------------------------------------ reading
def read_table(path: str | Path) -> pa.Table:
    """Read a parquet (or .jsonl/.json) file, turning the usual failures into one-line UserErrors."""
    path = Path(path).expanduser()
    if not path.exists():
        raise UserError(f"{path}: file not found; check the path (make one with `rlkit data gsm8k --out DIR`)")
    if path.is_dir():
        raise UserError(f"{path}: is a directory; pass a .parquet file inside it")
    if path.stat().st_size == 0:
        raise UserError(f"{path}: file is empty (0 bytes); regenerate it, e.g. `rlkit data gsm8k --force`")
    from rlkit.data.table_files import is_json_file, read_json_table

    if is_json_file(path):  # JSON Lines / JSON, as TRL users keep preference and SFT data
        return read_json_table(path)
    try:
        return pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UserError(f"{path}: not a readable parquet file ({first}); regenerate it with `rlkit data`") from None


def data_columns(table: pa.Table) -> list[str]:
    return [c for c in table.column_names if not c.startswith(PANDAS_INDEX_PREFIX)]


# ------------------------------------------------------------------ types
def _is_string(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def _field(t: pa.DataType, name: str) -> pa.Field | None:
    idx = t.get_field_index(name) if pa.types.is_struct(t) else -1
    return t.field(idx) if idx >= 0 else None


def _string_or_null(t: pa.DataType) -> bool:
    """An all-null column has type null; its rows are then reported one by one by the value checks."""
    return _is_string(t) or pa.types.is_null(t)


def _check_string(col: str, t: pa.DataType) -> list[Problem]:
    if _string_or_null(t):
        return []
    return [Problem(None, col, f"has type {t}, expected string; cast the column to string")]


def _check_prompt(col: str, t: pa.DataType) -> list[Problem]:
    fix = 'store a list of messages per row, e.g. [{"role": "user", "content": text}]'
    if not _is_list(t):
        return [Problem(None, col, f"has type {t}, expected list<struct<role, content>>; {fix}")]
    item = t.value_type
    if not pa.types.is_struct(item):
        return [Problem(None, col, f"items have type {item}, expected struct<role, content>; {fix}")]
    out = []
    for name in ("role", "content"):
        f = _field(item, name)
        if f is None:
            out.append(Problem(None, f"{col}[].{name}", f"messages have no '{name}' field; {fix}"))
        elif not _string_or_null(f.type):
            out.append(Problem(None, f"{col}[].{name}", f"has type {f.type}, expected string"))
    return out


def _check_reward_model(col: str, t: pa.DataType) -> list[Problem]:
    fix = 'store {"style": "rule", "ground_truth": answer} per row'
    if not pa.types.is_struct(t):
        return [Problem(None, col, f"has type {t}, expected struct<style, ground_truth>; {fix}")]
    out = []
    gt = _field(t, "ground_truth")
    if gt is None:
        out.append(Problem(None, f"{col}.ground_truth", f"field is missing; {fix}"))
    elif not _string_or_null(gt.type):
        out.append(
            Problem(None, f"{col}.ground_truth", f"has type {gt.type}; the built-in scorers expect a string", "warning")
        )
    if _field(t, "style") is None:
        out.append(Problem(None, f"{col}.style", 'field is missing (usually "rule")', "warning"))
    return out


def _check_extra_info(col: str, t: pa.DataType) -> list[Problem]:
    if pa.types.is_struct(t) or pa.types.is_null(t):
        return []
    return [Problem(None, col, f"has type {t}, expected a struct (e.g. {{split, index}}); store a dict per row")]


TYPE_CHECKS: dict[str, Callable[[str, pa.DataType], list[Problem]]] = {
    "data_source": _check_string,
    "prompt": _check_prompt,
    "ability": _check_string,
    "reward_model": _check_reward_model,
    "extra_info": _check_extra_info,
}


# ------------------------------------------------------------------ values
def _nonempty_strings(col: str, values: list[Any]) -> list[Problem]:
    return [Problem(i, col, "is null or empty") for i, v in enumerate(values) if v is None or v == ""]


def _prompt_values(col: str, values: list[Any]) -> list[Problem]:
    out = []
    for i, messages in enumerate(values):
        if not messages:
            out.append(Problem(i, col, "has no messages; every prompt needs at least one {role, content}"))
            continue
        for j, msg in enumerate(messages):
            if msg is None:
                out.append(Problem(i, f"{col}[{j}]", "message is null"))
                continue
            role = msg.get("role")
            if role not in ROLES:
                out.append(Problem(i, f"{col}[{j}].role", f"unknown role {role!r}; use one of {', '.join(ROLES)}"))
            if msg.get("content") is None:
                out.append(Problem(i, f"{col}[{j}].content", "is null; use an empty string if intended"))
    return out


def _is_empty(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, str):
        return not value.strip()
    if isinstance(value, (list, tuple, dict)):
        return len(value) == 0
    return False


def _reward_model_values(col: str, values: list[Any]) -> list[Problem]:
    out = []
    for i, rm in enumerate(values):
        if rm is None:
            out.append(Problem(i, col, "is null; every row needs a ground truth"))
        elif _is_empty(rm.get("ground_truth")):
            out.append(Problem(i, f"{col}.ground_truth", "is empty; every row needs a ground truth to score against"))
    return out


def _messages_values(col: str, values: list[Any]) -> list[Problem]:
    """A conversation's messages, as a prompt's, and at least one assistant turn to train on."""
    out = _prompt_values(col, values)
    for i, messages in enumerate(values):
        if messages and not any(m is not None and m.get("role") == "assistant" for m in messages):
            out.append(Problem(i, col, "has no assistant turn; SFT trains on the assistant's messages"))
    return out


VALUE_CHECKS: dict[str, Callable[[str, list[Any]], list[Problem]]] = {
    "data_source": _nonempty_strings,
    "prompt": _prompt_values,
    "ability": _nonempty_strings,
    "reward_model": _reward_model_values,
}


# ------------------------------------------------------------------ entry points
def validate_table(table: pa.Table, prompt_key: str = "prompt", strict: bool = False,
                   image_key: str = "images") -> list[Problem]:
    """Every problem in `table`, errors and warnings. `strict` makes extra columns errors; the `image_key`
    column (verl's images, rlkit/data/images.py) is a known one."""
    problems: list[Problem] = []
    columns = data_columns(table)
    named = {c: prompt_key if c == "prompt" else c for c in REQUIRED_COLUMNS}
    required = list(named.values())
    sft_only = MESSAGES in columns and prompt_key not in columns
    if MESSAGES in columns and prompt_key != MESSAGES:  # RL prompts may live in a column named messages too
        problems.extend(_check_prompt(MESSAGES, table.schema.field(MESSAGES).type) or
                        _messages_values(MESSAGES, table.column(MESSAGES).to_pylist()))
    if sft_only:
        named = {}
        problems.append(Problem(None, None, "conversations only (no RL columns): a file for `rlkit train sft`",
                                "warning"))
    for canonical, col in named.items():
        if col not in columns:
            problems.append(Problem(None, col, f"column is missing; every row needs '{col}' ({_HINTS[canonical]})"))
    extra_severity = "error" if strict else "warning"
    for col in columns:
        if col not in required and col not in (MESSAGES, image_key):
            problems.append(Problem(None, col, "extra column (passed to the trainer as-is)", extra_severity))
    if table.num_rows == 0:
        problems.append(Problem(None, None, "file has no rows; regenerate it or drop it from the file list"))
    for canonical, check in TYPE_CHECKS.items():
        col = named.get(canonical)
        if col is None or col not in columns:
            continue
        type_problems = check(col, table.schema.field(col).type)
        problems.extend(type_problems)
        if canonical in VALUE_CHECKS and not any(p.is_error for p in type_problems):
            problems.extend(VALUE_CHECKS[canonical](col, table.column(col).to_pylist()))
    return problems


def ensure_valid(table: pa.Table, path: str | Path, prompt_key: str = "prompt") -> list[Problem]:
    """Raise a one-line UserError on the first error (counting the rest); return the warnings."""
    problems = validate_table(table, prompt_key=prompt_key)
    errors = [p for p in problems if p.is_error]
    if errors:
        more = f" (and {len(errors) - 1} more; see `rlkit data inspect {path}`)" if len(errors) > 1 else ""
        raise UserError(f"{path}: {errors[0]}{more}")
    return [p for p in problems if not p.is_error]


_HINTS = {
    "data_source": 'e.g. "openai/gsm8k"; it selects the reward scorer',
    "prompt": 'a list of {"role", "content"} messages',
    "ability": 'e.g. "math"',
    "reward_model": '{"style": "rule", "ground_truth": answer}',
    "extra_info": "{split, index, ...}",
}
