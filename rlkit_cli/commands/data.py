"""`rlkit data`: one subcommand per dataset in `data_prep.DATASETS`, plus `inspect`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from data_prep.inspection import inspect_file
from data_prep.registry import load_datasets
from rlkit_cli.errors import friendly_errors

console = Console()


@friendly_errors
def inspect(
    file: Annotated[Path, typer.Argument(help="A parquet file in the common RL schema, or preference pairs.")],
    rows: Annotated[int, typer.Option("-n", "--rows", min=0, help="How many rows to print.")] = 3,
    prompt_key: Annotated[str, typer.Option("--prompt-key", help="Column holding the chat messages.")] = "prompt",
    strict: Annotated[bool, typer.Option("--strict", help="Treat extra columns as errors, not warnings.")] = False,
    limit: Annotated[int, typer.Option("--max-problems", min=1, help="Problems listed per severity.")] = 20,
    image_key: Annotated[str, typer.Option("--image-key", help="Column holding each row's images.")] = "images",
) -> None:
    """Validate a parquet file against the RL schema (or, with chosen/rejected columns, as preference pairs for
    `rlkit train dpo`) and print its first rows.

    Exit 0 when valid, 1 with the list of problems (row + column) otherwise.
    Example: [bold]rlkit data inspect ~/data/gsm8k/train.parquet -n 5[/bold]
    """
    if not inspect_file(file, console, rows=rows, prompt_key=prompt_key, strict=strict, limit=limit,
                        image_key=image_key):
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    data_app = typer.Typer(
        help="Prepare datasets as train/test parquet, check files. Example: [bold]rlkit data toy --out /tmp/toy[/bold]",
        no_args_is_help=True,
        rich_markup_mode="rich",
        context_settings={"help_option_names": ["-h", "--help"]},
    )
    datasets = load_datasets()
    for name in datasets.names():
        data_app.command(name)(friendly_errors(datasets.get(name)))
    data_app.command("inspect")(inspect)
    app.add_typer(data_app, name="data")
