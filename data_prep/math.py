"""MATH-style competition problems -> the common RL schema; ground truth = the final \\boxed{} answer.

Hub: `HuggingFaceH4/MATH-500` (test split only). No offline copy ships with rlkit, so
without the hub pass --source: jsonl/parquet rows with `problem`, `solution` and
optionally `answer` (preferred when present: it is the curated final answer).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import pyarrow as pa
import typer

from data_prep import options as opt
from data_prep.registry import DATASETS
from data_prep.runner import RowError, run
from data_prep.sources import HubDataset, resolve
from rlkit.data.schema import arrow_schema

DATA_SOURCE = "HuggingFaceH4/MATH-500"
SPLITS = ("train", "test")
HUB = HubDataset(DATA_SOURCE, None, ("test",))
INSTRUCTION = "Reason step by step and put the final answer inside \\boxed{}."
SCHEMA = arrow_schema([pa.field(name, pa.string()) for name in ("problem", "solution", "answer", "subject", "level")])
BOX_COMMANDS = ("\\boxed", "\\fbox")


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (or \\fbox{...}, or `\\boxed 5`), braces balanced; None if absent."""
    start = max(text.rfind(cmd) for cmd in BOX_COMMANDS)
    if start < 0:
        return None
    i = start + len(next(c for c in BOX_COMMANDS if text.startswith(c, start)))
    if i < len(text) and text[i] == " ":  # `\boxed 5`: up to the next space or `$`
        token = text[i + 1 :].split("$")[0].split()
        return token[0] if token else None
    if i >= len(text) or text[i] != "{":
        return None
    depth, j = 0, i
    while j < len(text):
        ch = text[j]
        if ch == "\\":  # an escaped char (\{, \}, \\) never opens or closes the box
            j += 2
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j].strip() or None
        j += 1
    return None  # unbalanced


def _text(record: dict[str, Any], name: str) -> str | None:
    value = record.get(name)
    return None if value is None else str(value)


def row_maker(data_source: str | None):
    """`--data-source` wins, then the record's own `data_source`, then MATH-500."""

    def make_row(record: dict[str, Any], split: str, index: int) -> dict[str, Any]:
        problem, solution = record.get("problem"), record.get("solution")
        if not isinstance(problem, str) or not problem.strip():
            raise RowError("field 'problem' is missing or empty (MATH rows need 'problem' and 'solution')")
        answer = _text(record, "answer")
        truth = (answer or "").strip() or last_boxed(solution if isinstance(solution, str) else "")
        if not truth:
            raise RowError("no final answer: the solution has no \\boxed{...} and there is no 'answer' field")
        source = data_source or (record.get("data_source") if isinstance(record.get("data_source"), str) else None)
        return {
            "data_source": source or DATA_SOURCE,
            "prompt": [{"role": "user", "content": f"{problem} {INSTRUCTION}"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": truth},
            "extra_info": {
                "split": split,
                "index": index,
                "problem": problem,
                "solution": _text(record, "solution"),
                "answer": answer,
                "subject": _text(record, "subject"),
                "level": _text(record, "level"),
            },
        }

    return make_row


@DATASETS.register("math")
def command(
    out: opt.Out = Path("~/data/math"),
    source: opt.Source = None,
    split: opt.Split = None,
    hub: opt.Hub = True,
    data_source: Annotated[
        str | None,
        typer.Option("--data-source", help="data_source to write (default: the rows' own, else MATH-500)."),
    ] = None,
    limit: opt.Limit = None,
    seed: opt.Seed = 0,
    force: opt.Force = False,
) -> None:
    """MATH-style problems (e.g. MATH-500) -> parquet; ground truth is the final \\boxed{} answer.

    Example: [bold]rlkit data math --source math500/test.jsonl --out ~/data/math[/bold]
    """
    resolved = resolve(source=source, splits=SPLITS, split=split, hub=HUB, use_hub=hub, dataset="math")
    run(
        dataset="math",
        resolved=resolved,
        make_row=row_maker(data_source),
        schema=SCHEMA,
        opts=opt.PrepOptions(out=out, limit=limit, seed=seed, force=force),
    )
