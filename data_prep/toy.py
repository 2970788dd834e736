"""A synthetic copy task a tiny random model learns with RL in minutes; nothing to download.

Other parts of rlkit rely on this exact format: data_source "rlkit/toy_copy" (scored by
the "toy_copy" scorer: fraction of digits copied to the right position), ability "toy",
prompt "copy the digits : 3 1 4", ground truth "3 1 4". Every word is in the vocabulary
of `rlkit.testing.build_tiny_tokenizer`, so the tiny tokenizer never emits <unk>.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer

from data_prep import options as opt
from data_prep.registry import DATASETS
from data_prep.runner import run
from data_prep.sft_format import Format, formatted
from data_prep.sources import Resolved, SplitRecords
from rlkit.data.schema import arrow_schema

DATA_SOURCE = "rlkit/toy_copy"
PREFIX = "copy the digits :"
SCHEMA = arrow_schema()
SPLIT_STREAMS = {"train": 0, "test": 1}  # each split its own RNG stream: sizes never change the other split


def generate(split: str, size: int, length: int, seed: int) -> SplitRecords:
    rng = np.random.default_rng([seed, SPLIT_STREAMS[split]])
    digits = rng.integers(0, 10, size=(size, length))
    records = SplitRecords(split)
    records.add(f"generated:{split}", [(i, {"digits": row.tolist()}) for i, row in enumerate(digits)])
    return records


def make_row(record: dict[str, Any], split: str, index: int) -> dict[str, Any]:
    target = " ".join(str(d) for d in record["digits"])
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"{PREFIX} {target}"}],
        "ability": "toy",
        "reward_model": {"style": "rule", "ground_truth": target},
        "extra_info": {"split": split, "index": index},
    }


@DATASETS.register("toy")
def command(
    out: opt.Out = Path("~/data/toy"),
    length: Annotated[int, typer.Option("--length", min=1, help="Digits per prompt.")] = 3,
    train_size: Annotated[int, typer.Option("--train-size", min=1, help="Rows in train.parquet.")] = 2048,
    test_size: Annotated[int, typer.Option("--test-size", min=1, help="Rows in test.parquet.")] = 128,
    limit: opt.Limit = None,
    seed: opt.Seed = 0,
    force: opt.Force = False,
    fmt: Format = "rl",
) -> None:
    """Synthetic digit-copy task for smoke runs with a tiny model (no download).

    Example: [bold]rlkit data toy --out /tmp/toy --length 4[/bold] ([bold]--format sft[/bold]: the copy as the
    assistant turn)
    """
    row_fn, schema = formatted(fmt, make_row, SCHEMA, lambda record, row: row["reward_model"]["ground_truth"])
    sizes = {"train": train_size, "test": test_size}
    splits = {split: generate(split, size, length, seed) for split, size in sizes.items()}
    resolved = Resolved(splits, f"generated (length={length}, seed={seed})")
    run(
        dataset="toy",
        resolved=resolved,
        make_row=row_fn,
        schema=schema,
        opts=opt.PrepOptions(out=out, limit=limit, seed=seed, force=force),
    )
