"""Data files in the formats TRL users keep: parquet, JSON Lines (one object per line) and JSON (a list of objects,
or an object of equal-length columns), read into one Arrow table. A broken line or value is one line naming the
file and the line, never a traceback.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa

from rlkit.errors import UserError

JSON_LINES = (".jsonl", ".ndjson")
JSON = (".json",)


def is_json_file(path: str | Path) -> bool:
    return Path(path).suffix.lower() in JSON_LINES + JSON


def _records(path: Path) -> list[dict[str, Any]]:
    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() in JSON_LINES:
        rows = []
        for i, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise UserError(f"{path} line {i}: not valid JSON ({exc.args[0].split(':')[0]}); one JSON object per "
                                "line") from None
            if not isinstance(row, dict):
                raise UserError(f"{path} line {i}: a JSON {type(row).__name__}, expected an object per line")
            rows.append(row)
        return rows
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise UserError(f"{path}: not valid JSON ({exc}); write a list of objects, or JSON Lines as .jsonl") from None
    if isinstance(data, dict) and data and all(isinstance(v, list) for v in data.values()):
        lengths = {len(v) for v in data.values()}
        if len(lengths) != 1:
            raise UserError(f"{path}: an object of columns of different lengths {sorted(lengths)}")
        names = list(data)
        return [dict(zip(names, values)) for values in zip(*data.values())]
    if isinstance(data, list) and all(isinstance(r, dict) for r in data):
        return data
    raise UserError(f"{path}: expected a JSON list of objects (or an object of columns); write one row per object")


def read_json_table(path: str | Path) -> pa.Table:
    """A .jsonl/.json file as an Arrow table (columns typed from the values, as `datasets` infers them)."""
    path = Path(path).expanduser()
    rows = _records(path)
    try:
        return pa.Table.from_pylist(rows)
    except (pa.ArrowException, TypeError, ValueError) as exc:
        raise UserError(f"{path}: the rows do not share one type per column ({str(exc).splitlines()[0]}); give "
                        "every row's field the same kind of value (all strings, or all message lists)") from None
