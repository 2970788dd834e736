"""`rlkit runs [DIR]`: the runs under a folder, one row each (status from the run's own files and its driver's pid)."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from rlkit.runs.read import RunRow, find_runs, format_duration, summarize
from rlkit_cli.errors import friendly_errors

DEFAULT_ROOT = "checkpoints"  # trainer.default_local_dir is checkpoints/<project>/<experiment> unless set
STATE_STYLE = {"running": "bold cyan", "finished": "green", "failed": "bold red", "interrupted": "yellow"}


def register(app: typer.Typer) -> None:
    app.command("runs")(runs)


def output_console() -> Console:
    """The terminal's width on a terminal; piped or in a log file, wide enough that no path or number is folded."""
    console = Console()
    return console if console.is_terminal else Console(width=max(console.width, 160), color_system=None)


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def runs_table(rows: list[RunRow]) -> Table:
    table = Table(title=f"{len(rows)} run{'s' if len(rows) != 1 else ''}")
    for column in ("name", "trainer", "status", "step", "reward", "val score", "elapsed", "precision", "path"):
        table.add_column(column, overflow="fold", justify="right" if column in ("step", "reward", "val score") else
                         "left")
    for r in rows:
        table.add_row(
            r.name, r.trainer, f"[{STATE_STYLE.get(r.status, '')}]{r.status}[/]" if r.status in STATE_STYLE else
            r.status, f"{r.step}/{r.total if r.total is not None else '?'}", _num(r.reward), _num(r.val_score),
            format_duration(r.elapsed_s), r.precision or "-", r.path,
        )
    return table


@friendly_errors
def runs(
    folder: Path = typer.Argument(Path(DEFAULT_ROOT), help="Folder to look for runs in (trainer.default_local_dir, "
                                  "or a folder above it). Default: ./checkpoints."),
    as_json: bool = typer.Option(False, "--json", help="One JSON list of the rows, for scripts."),
) -> None:
    """List the runs under a folder: name, trainer, status (running / finished / failed / interrupted), step, last
    training reward and validation score, elapsed time, precision, path.

    A run is a folder with the status.json its driver keeps (or, for an older run, logs/metrics.jsonl). A run whose
    status says running but whose driver process is gone reads as interrupted.

    Example: [bold]rlkit runs checkpoints[/bold]  or  [bold]rlkit runs /data/exp --json[/bold]
    """
    root = folder.expanduser()
    rows = [summarize(path, root) for path in find_runs(root)]
    if as_json:
        typer.echo(json.dumps([r.as_dict() for r in rows], indent=1))
        return
    console = output_console()
    if not rows:
        console.print(f"no runs under {root} (a run folder has status.json or logs/metrics.jsonl)")
        return
    console.print(runs_table(rows))
    for r in rows:
        if r.status == "failed" and r.error:
            console.print(f"[red]{r.name}[/red]: {r.error}", markup=True, soft_wrap=True)
