"""Options shared by every `rlkit data NAME` command, declared once so they read the same everywhere."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

Out = Annotated[Path, typer.Option("--out", "-o", help="Directory for train.parquet / test.parquet.")]
Limit = Annotated[int | None, typer.Option("--limit", min=1, help="Keep only the first N rows of each split.")]
Seed = Annotated[int, typer.Option("--seed", help="Random seed (generated data; real datasets keep their order).")]
Force = Annotated[bool, typer.Option("--force", "-f", help="Overwrite existing output files.")]
Source = Annotated[
    Path | None,
    typer.Option(
        "--source",
        "-s",
        help="Local data instead of the hub: a .jsonl/.parquet file or a directory with train/test files.",
    ),
]
Split = Annotated[
    str | None,
    typer.Option("--split", help="Split name for a single-file --source (default: from the file name, else train)."),
]
Hub = Annotated[
    bool,
    typer.Option("--hub/--no-hub", help="Without --source, try the Hugging Face hub first (needs `datasets`)."),
]


@dataclass(frozen=True)
class PrepOptions:
    """The common options, as passed to `data_prep.runner.run`."""

    out: Path
    limit: int | None = None
    seed: int = 0
    force: bool = False
