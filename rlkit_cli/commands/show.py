"""`rlkit show RUN`: a run's curves in the terminal (plotext), where a step's time goes, memory per process, and
its latest samples; `--png` the same plots as an image."""

from __future__ import annotations

import shutil
from pathlib import Path

import typer
from rich.table import Table

from rlkit.errors import UserError
from rlkit.runs.plots import build_panels, missing_metrics, png, terminal
from rlkit.runs.read import before_after, latest_samples, log_dir_of, read_rows, resolve_run, summarize
from rlkit.runs.status import read_status
from rlkit_cli.commands.runs import DEFAULT_ROOT, output_console, runs_table
from rlkit_cli.errors import friendly_errors

SAMPLE_CHARS = 160


def register(app: typer.Typer) -> None:
    app.command("show")(show)


def _load(name: str, root: Path) -> tuple[Path, str, list[dict]]:
    folder = resolve_run(name, root)
    status = read_status(folder)
    row = summarize(folder)
    rows = read_rows(log_dir_of(folder, status))
    if not rows:
        raise UserError(f"{folder}: no metrics logged yet ({log_dir_of(folder, status) / 'metrics.jsonl'} is missing "
                        "or empty); the run logs them with trainer.logger including 'file'")
    return folder, row.trainer, rows


def samples_table(folder: Path, limit: int, width: int | None = None) -> Table | None:
    where, samples = latest_samples(folder, limit)
    if not samples:
        return None
    step = samples[0].get("step", "?")
    table = Table(title=f"latest samples (step {step}, {where})", show_lines=True, width=width)
    table.add_column("prompt", overflow="fold", ratio=3)
    table.add_column("response", overflow="fold", ratio=2)
    table.add_column("score", justify="right")
    for s in samples:
        score = s.get("score")
        table.add_row(str(s.get("input", ""))[-SAMPLE_CHARS:], str(s.get("output", ""))[:SAMPLE_CHARS],
                      f"{score:.3f}" if isinstance(score, (int, float)) else str(score))
    return table


@friendly_errors
def show(
    run: str = typer.Argument(..., help="The run: its folder (trainer.default_local_dir) or its name under --root."),
    metric: list[str] = typer.Option(None, "--metric", "-m", help="A logged metric to plot instead of the trainer's "
                                     "curves; globs work (actor/*). Repeat for more."),
    compare: str = typer.Option(None, "--compare", help="A second run whose curves are overlaid on this one's."),
    png_file: Path = typer.Option(None, "--png", help="Also write the same plots as a PNG image (matplotlib)."),
    root: Path = typer.Option(Path(DEFAULT_ROOT), "--root", help="Where a run given by name is looked for."),
    samples: int = typer.Option(3, "--samples", help="How many of the latest samples to show (0: none)."),
    width: int = typer.Option(0, "--width", help="Plot width in characters (default: the terminal's, at most 120)."),
    summary: bool = typer.Option(False, "--summary", help="Only the reward and validation curves and a before/after "
                                 "table of the run (what `make quickstart` ends with)."),
) -> None:
    """Plot a run: for RL its reward and validation score, response length, entropy, KL / clip fraction and loss;
    for SFT/DPO its loss, accuracy and margins; a bar per phase of where a step's time goes; memory per process
    over the steps; and the latest samples (prompt, response, score).

    Example: [bold]rlkit show checkpoints/rlkit/run[/bold]  or
    [bold]rlkit show run1 --compare run2 -m 'actor/*' --png curves.png[/bold]
    """
    if summary:
        _summary(run, root, width)
        return
    _show(run, metric or [], compare, png_file, root, samples, width)


def _plot_width(width: int) -> int:
    return width or min(120, shutil.get_terminal_size((100, 24)).columns)


def before_after_table(rows: list[dict]) -> Table:
    table = Table(title="before / after")
    for col in ("metric", "first", "last"):
        table.add_column(col, justify="left" if col == "metric" else "right")
    for key, first, last in before_after(rows):
        table.add_row(key, f"{first:.4f}", f"{last:.4f}")
    return table


def _summary(run: str, root: Path, width: int) -> None:
    """The run's reward and validation curves above its before/after table."""
    console = output_console()
    folder, kind, rows = _load(run, root)
    typer.echo(terminal(build_panels([(folder.name, rows)], kind)[:1], width=_plot_width(width),
                        color=console.is_terminal))
    console.print(before_after_table(rows))


def _show(run: str, metrics: list[str], compare: str | None, png_file: Path | None, root: Path, samples: int,
          width: int) -> None:
    console = output_console()
    folder, kind, rows = _load(run, root)
    runs = [(folder.name, rows)]
    summaries = [summarize(folder)]
    if compare:
        other, _, other_rows = _load(compare, root)
        if other.name == folder.name:
            runs = [(str(folder), rows), (str(other), other_rows)]
        else:
            runs.append((other.name, other_rows))
        summaries.append(summarize(other))
    if metrics:
        missing = missing_metrics([r for _, r in runs], metrics)
        if missing:
            keys = sorted({k for _, rs in runs for row in rs for k in row if k not in ("step", "time")})
            raise UserError(f"--metric {', '.join(missing)}: no logged metric matches; logged: "
                            f"{', '.join(keys[:40])}{' ...' if len(keys) > 40 else ''}")
    panels = build_panels(runs, kind, metrics)
    console.print(runs_table(summaries))
    typer.echo(terminal(panels, width=_plot_width(width), color=console.is_terminal))
    if samples > 0:
        table = samples_table(folder, samples, _plot_width(width))
        if table is not None:
            console.print(table)
    if png_file is not None:
        title = " vs ".join(label for label, _ in runs)
        written = png(panels, png_file, title=title)
        console.print(f"wrote {written} ({len(panels)} plots)")
