"""GSM8K (grade-school math word problems) -> the common RL schema.

Source order: --source, the hub (`openai/gsm8k`, config `main`), then the original
release shipped in data_prep/assets/gsm8k (MIT), so this works offline.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pyarrow as pa

from data_prep import options as opt
from data_prep.registry import DATASETS
from data_prep.runner import RowError, run
from data_prep.sft_format import Format, formatted
from data_prep.sources import HubDataset, resolve
from rlkit.data.schema import arrow_schema

DATA_SOURCE = "openai/gsm8k"
SPLITS = ("train", "test")
HUB = HubDataset(DATA_SOURCE, "main", SPLITS)
INSTRUCTION = 'Work it out step by step, then write the final answer as a number after "####".'
SCHEMA = arrow_schema([pa.field("answer", pa.string()), pa.field("question", pa.string())])


def ground_truth(answer: str) -> str:
    """The final answer: the text after the last "####", commas dropped ("1,000" -> "1000")."""
    if "####" not in answer:
        raise RowError("answer has no '#### N' final line; every GSM8K answer ends with one")
    value = answer.rsplit("####", 1)[1].strip().replace(",", "")
    if not value:
        raise RowError("nothing follows '####' in the answer")
    return value


def solution(record: dict[str, Any], row: dict[str, Any]) -> str:
    """The reference solution as an assistant would write it: the steps without GSM8K's calculator annotations
    (`<<48/2=24>>`), ending in the `#### N` line the instruction asks for."""
    steps, _, final = record["answer"].rpartition("####")
    return f"{re.sub(r'<<[^>]*>>', '', steps).strip()}\n#### {final.strip()}"


def make_row(record: dict[str, Any], split: str, index: int) -> dict[str, Any]:
    question, answer = record.get("question"), record.get("answer")
    for name, value in (("question", question), ("answer", answer)):
        if not isinstance(value, str):
            raise RowError(f"field '{name}' is missing or not a string (GSM8K rows need 'question' and 'answer')")
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"{question} {INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": ground_truth(answer)},
        "extra_info": {"split": split, "index": index, "answer": answer, "question": question},
    }


@DATASETS.register("gsm8k")
def command(
    out: opt.Out = Path("~/data/gsm8k"),
    source: opt.Source = None,
    split: opt.Split = None,
    hub: opt.Hub = True,
    limit: opt.Limit = None,
    seed: opt.Seed = 0,
    force: opt.Force = False,
    fmt: Format = "rl",
) -> None:
    """GSM8K grade-school math -> train/test parquet (offline copy included).

    Example: [bold]rlkit data gsm8k --out ~/data/gsm8k[/bold]
    or from the original release: [bold]rlkit data gsm8k --source gsm8k/ --out /tmp/g --force[/bold]
    SFT, the reference solutions as assistant turns: [bold]rlkit data gsm8k --format sft -o ~/data/gsm8k_sft[/bold]
    """
    row_fn, schema = formatted(fmt, make_row, SCHEMA, solution)
    resolved = resolve(
        source=source, splits=SPLITS, split=split, hub=HUB, use_hub=hub, packaged="gsm8k", dataset="gsm8k"
    )
    run(
        dataset="gsm8k",
        resolved=resolved,
        make_row=row_fn,
        schema=schema,
        opts=opt.PrepOptions(out=out, limit=limit, seed=seed, force=force),
    )
