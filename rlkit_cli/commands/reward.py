"""`rlkit reward score`: score a JSONL file of responses with the training reward path."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from rlkit.errors import UserError
from rlkit.utils.fs_checks import ensure_writable_file
from rlkit_cli.errors import friendly_errors

reward_app = typer.Typer(
    help="Rewards: score responses offline with the same scorers as training. "
    "Example: [bold]rlkit reward score responses.jsonl[/bold]",
    rich_markup_mode="rich",
    no_args_is_help=True,
)
console = Console()


def register(app: typer.Typer) -> None:
    app.add_typer(reward_app, name="reward")


def _read_rows(path: Path) -> list[dict[str, Any]]:
    """Parse and check every line first, so a bad line fails before any scoring work."""
    if not path.is_file():
        raise UserError(f"{path}: file not found")
    rows = []
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise UserError(f"{path} line {lineno}: not valid JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise UserError(f"{path} line {lineno}: expected a JSON object, got {type(row).__name__}")
            for key in ("data_source", "response", "ground_truth"):
                if key not in row:
                    raise UserError(
                        f"{path} line {lineno}: missing key '{key}' (needs data_source, response, ground_truth)"
                    )
            if not isinstance(row["response"], str):
                raise UserError(f"{path} line {lineno}: 'response' must be a string")
            if row.get("extra_info") is not None and not isinstance(row["extra_info"], dict):
                raise UserError(f"{path} line {lineno}: 'extra_info' must be an object")
            rows.append(row)
    if not rows:
        raise UserError(f"{path}: no rows to score (empty file)")
    return rows


def _summary(rows: list[dict[str, Any]], results: list) -> Table:
    groups: dict[str, list] = defaultdict(list)
    for row, res in zip(rows, results):
        groups[str(row["data_source"])].append(res)
    table = Table(title="reward score")
    for col in ("data_source", "scorer", "count", "mean score", "errors"):
        table.add_column(col, justify="left" if col in ("data_source", "scorer") else "right")
    for ds, res in sorted(groups.items()):
        scorers = ",".join(sorted({r.scorer for r in res}))
        errors = sum(r.error is not None for r in res)
        mean = sum(r.score for r in res) / len(res)
        table.add_row(ds, scorers, str(len(res)), f"{mean:.4f}", f"[red]{errors}[/red]" if errors else "0")
    return table


@reward_app.command("score")
@friendly_errors
def score(
    input_path: Path = typer.Argument(
        ..., metavar="IN.jsonl", help="Lines of {data_source, response, ground_truth, extra_info?}."
    ),
    out: Path = typer.Option(
        None, "--out", "-o", help="Where to write the scored lines (default: IN.scored.jsonl next to IN)."
    ),
    method: str = typer.Option(
        None, "--method", help="gsm8k extraction: strict (last '#### N') or flexible (last number)."
    ),
    custom_path: Path = typer.Option(None, "--custom-path", help="A .py file with your reward function."),
    custom_name: str = typer.Option("compute_score", "--custom-name", help="The function's name in --custom-path."),
    workers: int = typer.Option(4, "--workers", help="Scorer threads."),
    timeout: float = typer.Option(10.0, "--timeout", help="Seconds per sample before it scores 0."),
) -> None:
    """Score each line and write it back with `score` (and `reward_extra`, `reward_error`).

    Prints a table per data_source: count, mean score, errors. Exit 0, or 1 on bad input.

    Example: [bold]rlkit reward score responses.jsonl --out scored.jsonl --method flexible[/bold]
    """
    from rlkit.reward.manager import RewardManager

    if method is not None and method not in ("strict", "flexible"):
        raise UserError(f"--method must be 'strict' or 'flexible', got '{method}'")
    rows = _read_rows(input_path)
    out = ensure_writable_file(
        out or input_path.with_name(input_path.name.removesuffix(".jsonl") + ".scored.jsonl"), "--out"
    )  # checked before scoring, which can take long (code sandboxes, custom functions)
    custom = {"path": str(custom_path), "name": custom_name} if custom_path else None
    kwargs = {"gsm8k": {"method": method}} if method else None
    manager = RewardManager(None, custom_fn=custom, num_workers=workers, timeout_s=timeout, scorer_kwargs=kwargs)
    results = manager.score_texts(
        [r["response"] for r in rows],
        [r["ground_truth"] for r in rows],
        [str(r["data_source"]) for r in rows],
        [r.get("extra_info") for r in rows],
    )
    with out.open("w", encoding="utf-8") as fh:
        for row, res in zip(rows, results):
            row = {**row, "score": res.score}
            if res.extras:
                row["reward_extra"] = res.extras
            if res.error:
                row["reward_error"] = res.error
            fh.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
    console.print(_summary(rows, results))
    console.print(f"wrote {len(rows)} rows to {out}")
