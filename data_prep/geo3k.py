"""Geometry3K (`hiyouga/geometry3k`) from a local copy in its published layout -> the common RL schema + images.

The published parquet shards (`data/train-*.parquet`, `data/validation-*.parquet`, `data/test-*.parquet`) hold
`images` (a list of {bytes, path}), `problem` (with an `<image>` placeholder) and `answer`. Rows keep verl's
layout: the problem plus an instruction to box the final answer, the images column as it is, data_source
`hiyouga/geometry3k` (scored by the `math` scorer: the last \\boxed{} against the answer). Nothing is downloaded:
pass --source.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa

from data_prep import options as opt
from data_prep.registry import DATASETS
from data_prep.runner import RowError, run
from data_prep.sources import Resolved, load_local
from rlkit.data.images import PLACEHOLDER
from rlkit.data.schema import arrow_schema
from rlkit.errors import UserError

DATA_SOURCE = "hiyouga/geometry3k"
SPLITS = ("train", "validation", "test")
INSTRUCTION = "Think step by step about the figure, then give the final answer inside \\boxed{}."
SCHEMA = arrow_schema([pa.field("answer", pa.string()), pa.field("question", pa.string())], images=True)


def make_row(record: dict[str, Any], split: str, index: int) -> dict[str, Any]:
    problem, answer, images = record.get("problem"), record.get("answer"), record.get("images")
    if not isinstance(problem, str) or not problem.strip():
        raise RowError("field 'problem' is missing or empty (Geometry3K rows need 'problem', 'answer', 'images')")
    if answer is None or not str(answer).strip():
        raise RowError("field 'answer' is missing or empty")
    if not isinstance(images, list) or not images:
        raise RowError("field 'images' is missing or empty (a list of {bytes, path})")
    if PLACEHOLDER not in problem:  # one figure per problem, shown before the text as verl's rows do
        problem = PLACEHOLDER * len(images) + problem
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"{problem} {INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(answer).strip()},
        "extra_info": {"split": split, "index": index, "answer": str(answer), "question": problem},
        "images": [{"bytes": im.get("bytes"), "path": im.get("path")} if isinstance(im, dict)
                   else {"bytes": None, "path": str(im)} for im in images],
    }


@DATASETS.register("geo3k")
def command(
    source: opt.Source = None,
    out: opt.Out = Path("~/data/geo3k"),
    limit: opt.Limit = None,
    seed: opt.Seed = 0,
    force: opt.Force = False,
) -> None:
    """Geometry3K (figures + problems) from a local copy of its published parquet shards -> parquet with images.

    Example: [bold]rlkit data geo3k --source ~/hf/geometry3k --out ~/data/geo3k[/bold]
    """
    if source is None:
        raise UserError("rlkit data geo3k needs --source DIR: a local copy of hiyouga/geometry3k (its data/*.parquet "
                        "shards); rlkit downloads nothing here")
    splits = load_local(source, SPLITS)
    resolved = Resolved(splits, f"local copy {source}")
    run(dataset="geo3k", resolved=resolved, make_row=make_row, schema=SCHEMA,
        opts=opt.PrepOptions(out=out, limit=limit, seed=seed, force=force))

