"""The shared pipeline behind every `rlkit data NAME`: records -> schema rows -> parquet, with progress.

A dataset module only supplies where the records come from and how one record
becomes one row; checking outputs, `--limit`, progress, writing and the summary
are the same for all of them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from data_prep.options import PrepOptions
from data_prep.sources import Resolved
from data_prep.writer import prepare_out_dir, refuse_overwrite, write_split
from rlkit.errors import UserError

console = Console()
progress_console = Console(stderr=True)


class RowError(ValueError):
    """A record that cannot become a row; the runner adds its file and line."""


RowFn = Callable[[dict[str, Any], str, int], dict[str, Any]]  # (record, split, index) -> row


@dataclass
class SplitResult:
    split: str
    rows: int
    path: Path
    sample: dict[str, Any]


def run(
    *, dataset: str, resolved: Resolved, make_row: RowFn, schema: pa.Schema, opts: PrepOptions
) -> list[SplitResult]:
    """Convert every split of `resolved`, write `<out>/<split>.parquet`, print a summary."""
    out = opts.out.expanduser()
    paths = {split: out / f"{split}.parquet" for split in resolved.splits}
    refuse_overwrite(paths.values(), opts.force)
    out = prepare_out_dir(out)
    results = []
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=progress_console, transient=True) as progress:
        for split, source in resolved.splits.items():
            n = len(source.records) if opts.limit is None else min(opts.limit, len(source.records))
            task = progress.add_task(f"{dataset} {split}: rows", total=n)
            rows = []
            for i in range(n):
                try:
                    rows.append(make_row(source.records[i], split, i))
                except RowError as exc:
                    raise UserError(f"{source.where(i)}: {exc}") from None
                if i % 256 == 0:
                    progress.update(task, completed=i)
            progress.update(task, completed=n, description=f"{dataset} {split}: writing")
            write_split(rows, schema, paths[split])
            results.append(SplitResult(split, n, paths[split], rows[0]))
    print_summary(dataset, resolved.description, results)
    return results


def _size(path: Path) -> str:
    size = float(path.stat().st_size)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return ""  # unreachable


def _shown(value: object) -> str:
    """How the sample shows what JSON cannot hold (an image's bytes)."""
    return f"<{len(value)} bytes>" if isinstance(value, (bytes, bytearray)) else repr(value)


def print_summary(dataset: str, source: str, results: list[SplitResult]) -> None:
    table = Table(title=f"rlkit data {dataset}", title_justify="left")
    for name, justify in (("split", "left"), ("rows", "right"), ("file", "left"), ("size", "right")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for r in results:
        table.add_row(r.split, f"{r.rows:,}", str(r.path), _size(r.path))
    console.print(table)
    console.print(f"[bold]source:[/bold] {source}")
    if results:
        console.print(f"[bold]sample ({results[0].split}[0]):[/bold]")
        console.print_json(json.dumps(results[0].sample, ensure_ascii=False, default=_shown))
