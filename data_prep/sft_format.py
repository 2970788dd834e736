"""`--format sft` of `rlkit data NAME`: each RL row also gets `messages`, its prompt followed by the dataset's reference
answer as the assistant turn, so one file serves `rlkit train sft` (messages), `rlkit eval` and RL validation (prompt
and ground truth)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

import pyarrow as pa
import typer

from data_prep.runner import RowFn
from rlkit.data.schema import MESSAGES, with_messages
from rlkit.errors import UserError

FORMATS = ("rl", "sft")
Format = Annotated[str, typer.Option("--format", help="rl: prompts and ground truths; sft: also `messages`, the "
                                     "prompt with the reference answer as the assistant turn (rlkit train sft).")]


def formatted(fmt: str, make_row: RowFn, schema: pa.Schema,
              answer: Callable[[dict[str, Any], dict[str, Any]], str]) -> tuple[RowFn, pa.Schema]:
    """The row function and schema of `--format fmt`; `answer(record, row)` is the assistant turn of an SFT row."""
    if fmt not in FORMATS:
        raise UserError(f"--format {fmt}: use one of {', '.join(FORMATS)}")
    if fmt == "rl":
        return make_row, schema

    def sft_row(record: dict[str, Any], split: str, index: int) -> dict[str, Any]:
        row = make_row(record, split, index)
        row[MESSAGES] = [*row["prompt"], {"role": "assistant", "content": answer(record, row)}]
        return row

    return sft_row, with_messages(schema)
