"""`rlkit data messages FILE.jsonl`: a user's own conversations -> train/test parquet for `rlkit train sft`.

Each line holds `{"messages": [{role, content}, ...], "tools": [...]}` (tools optional; OpenAI's chat format, as
verl's multi-turn SFT files and most chat datasets). Tool calls and tool schemas are kept as JSON text, so
conversations whose calls differ in shape share one parquet schema; the SFT dataset decodes them again.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import pyarrow as pa
import typer

from data_prep import options as opt
from data_prep.registry import DATASETS
from data_prep.runner import RowError, run
from data_prep.sources import Resolved, SplitRecords, read_file
from rlkit.data.schema import MESSAGES, ROLES

MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string()), ("name", pa.string()),
                     ("tool_call_id", pa.string()), ("tool_calls", pa.string())])
SCHEMA = pa.schema([(MESSAGES, pa.list_(MESSAGE)), ("tools", pa.string())])


def message(msg: Any, j: int) -> dict[str, Any]:
    if not isinstance(msg, dict) or msg.get("role") not in ROLES:
        raise RowError(f"message {j} needs a role of {', '.join(ROLES)} (got {msg!r:.60})")
    content, calls = msg.get("content"), msg.get("tool_calls")
    if not isinstance(content, str) and not calls:
        raise RowError(f"message {j} ({msg['role']}) has no text content and no tool_calls")
    return {"role": msg["role"], "content": content if isinstance(content, str) else "",
            "name": msg.get("name"), "tool_call_id": msg.get("tool_call_id"),
            "tool_calls": json.dumps(calls) if calls else None}


def make_row(key: str):
    def row(record: dict[str, Any], split: str, index: int) -> dict[str, Any]:
        messages = record.get(key)
        if not isinstance(messages, list) or not messages:
            raise RowError(f"no '{key}' list (each line needs {{\"{key}\": [{{\"role\": ..., \"content\": ...}}]}}; "
                           "--messages-key names another field)")
        out = [message(m, j) for j, m in enumerate(messages)]
        if not any(m["role"] == "assistant" for m in out):
            raise RowError("the conversation has no assistant turn; SFT trains on the assistant's messages")
        tools = record.get("tools")
        return {MESSAGES: out, "tools": json.dumps(tools) if tools else None}
    return row


@DATASETS.register("messages")
def command(
    file: Annotated[Path, typer.Argument(help="A .jsonl (or .parquet) file of conversations.")],
    out: opt.Out = Path("~/data/messages"),
    messages_key: Annotated[str, typer.Option("--messages-key", help="The field holding each conversation.")] = (
        "messages"),
    test_size: Annotated[int, typer.Option("--test-size", min=0, help="Last N conversations go to test.parquet "
                                           "(the validation loss); 0 = none.")] = 0,
    limit: opt.Limit = None,
    force: opt.Force = False,
) -> None:
    """Your own conversations (`{"messages": [...], "tools": [...]}` per line) -> parquet for `rlkit train sft`.

    Example: [bold]rlkit data messages chats.jsonl --out ~/data/chats --test-size 100[/bold]
    """
    path = file.expanduser()
    located = read_file(path)
    if test_size >= len(located):
        raise typer.BadParameter(f"--test-size {test_size} leaves no training conversation of {len(located)}")
    cut = len(located) - test_size
    splits = {"train": SplitRecords("train")}
    splits["train"].add(str(path), located[:cut])
    if test_size:
        splits["test"] = SplitRecords("test")
        splits["test"].add(str(path), located[cut:])
    run(dataset="messages", resolved=Resolved(splits, str(path)), make_row=make_row(messages_key), schema=SCHEMA,
        opts=opt.PrepOptions(out=out, limit=limit, force=force))
