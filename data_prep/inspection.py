"""`rlkit data inspect`: show a parquet file's schema and first rows, list every problem.

Validation is `rlkit.data.schema.validate_table`, the same check the training loader
runs, so a file that inspects clean also loads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from rlkit.data.images import describe_images
from rlkit.data.preference_schema import PREFERENCE_COLUMNS, is_preference_table, validate_preference_table
from rlkit.data.schema import Problem, read_table, validate_table

MAX_VALUE_CHARS = 400


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= MAX_VALUE_CHARS else text[:MAX_VALUE_CHARS] + " …"


def _render_prompt(value: Any) -> str:
    if isinstance(value, list) and all(isinstance(m, dict) for m in value):
        return "\n".join(
            f"[bold]{escape(str(m.get('role')))}:[/bold] {escape(_short(m.get('content')))}" for m in value
        )
    return escape(_short(value))


def schema_table(table: pa.Table, path: Path) -> Table:
    out = Table(title=f"{path}  ({table.num_rows:,} rows)", title_justify="left")
    out.add_column("column")
    out.add_column("type")
    for field in table.schema:
        out.add_row(field.name, escape(str(field.type)))
    return out


def row_table(row: dict[str, Any], number: int, message_columns: tuple[str, ...], image_key: str = "images",
              where: str = "", base_dir: str | None = None) -> Table:
    out = Table(title=f"row {number}", title_justify="left", show_header=False)
    out.add_column("field", style="cyan", no_wrap=True)
    out.add_column("value", overflow="fold")
    for key, value in row.items():
        if key in message_columns:
            shown = _render_prompt(value)
        elif key == image_key:
            shown = escape(describe_images(value, f"{where} row {number}, column '{key}'", base_dir))
        else:
            shown = escape(_short(value))
        out.add_row(key, shown)
    return out


def image_totals(table: pa.Table, image_key: str) -> str | None:
    """Rows with images and images in all, from the column's list lengths (nothing decoded)."""
    if image_key not in table.column_names:
        return None
    counts = [len(c or []) for c in table.column(image_key).to_pylist()]
    return (f"images: {sum(counts):,} in {sum(c > 0 for c in counts):,} of {len(counts):,} rows "
            f"(at most {max(counts, default=0)} per row)")


def problem_lines(problems: list[Problem], limit: int) -> list[str]:
    lines = []
    for severity, style in (("error", "red"), ("warning", "yellow")):
        found = [p for p in problems if p.severity == severity]
        for p in found[:limit]:
            lines.append(f"[{style}]{severity}:[/{style}] {escape(str(p))}")
        if len(found) > limit:
            lines.append(f"[{style}]… and {len(found) - limit} more {severity}s[/{style}]")
    return lines


def inspect_file(
    path: Path, console: Console, rows: int = 3, prompt_key: str = "prompt", strict: bool = False, limit: int = 20,
    image_key: str = "images",
) -> bool:
    """Print the report; True when the file has no errors (warnings allowed). A file with `chosen` and `rejected`
    columns is checked as preference pairs (rlkit.data.preference_schema), any other in the RL schema."""
    table = read_table(path)
    if is_preference_table(table):
        problems, message_columns = validate_preference_table(table), PREFERENCE_COLUMNS
    else:
        problems = validate_table(table, prompt_key=prompt_key, strict=strict, image_key=image_key)
        message_columns = (prompt_key,)
    console.print(schema_table(table, path))
    if (totals := image_totals(table, image_key)) is not None:
        console.print(totals)
    for i, row in enumerate(table.slice(0, max(rows, 0)).to_pylist()):
        console.print(row_table(row, i, message_columns, image_key, str(path), str(path.parent)))
    for line in problem_lines(problems, limit):
        console.print(line)
    errors = sum(p.is_error for p in problems)
    if errors:
        console.print(f"[bold red]invalid:[/bold red] {errors} problem{'s' * (errors != 1)} in {path}")
    else:
        console.print(f"[bold green]valid:[/bold green] {table.num_rows:,} rows in {path}")
    return errors == 0
