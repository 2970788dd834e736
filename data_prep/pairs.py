"""`rlkit data pairs EVAL.jsonl`: a model's own scored generations -> preference pairs for `rlkit train dpo`.

`rlkit eval --n K` writes every sample with its prompt, response and score; per prompt the best-scored
response becomes `chosen` and the worst `rejected` (the first of equals, in sampling order), and prompts
whose spread is not above `--min-margin` give no pair: a tie says nothing about which reply is better.
`--reward NAME` re-scores every response with a registered scorer instead of the score eval recorded.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import pyarrow as pa
import typer

from data_prep import options as opt
from data_prep.registry import DATASETS
from data_prep.runner import SplitResult, print_summary
from data_prep.writer import prepare_out_dir, refuse_overwrite, write_table
from rlkit.data.preference_schema import validate_preference_table
from rlkit.data.schema import PROMPT_TYPE
from rlkit.errors import UserError

SCHEMA = pa.schema([
    ("prompt", PROMPT_TYPE),
    ("chosen", pa.string()),
    ("rejected", pa.string()),
    ("chosen_score", pa.float64()),
    ("rejected_score", pa.float64()),
    ("data_source", pa.string()),
    ("extra_info", pa.struct([("prompt_index", pa.int64()), ("samples", pa.int64())])),
])
EVAL_KEYS = ("prompt_index", "prompt", "response", "score")


def read_eval_rows(path: Path) -> list[dict[str, Any]]:
    """The generations of an `rlkit eval` JSONL, each checked for the keys pairing reads."""
    rows = []
    with path.open() as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UserError(f"{path} line {line_no}: not JSON ({exc.msg}); pass the .jsonl `rlkit eval` wrote") \
                    from None
            missing = [k for k in EVAL_KEYS if row.get(k) is None]
            if missing:
                raise UserError(f"{path} line {line_no}: no {', '.join(missing)}; pass the generations `rlkit eval "
                                "--out` writes (run eval on a file with prompts as messages)")
            rows.append(row)
    if not rows:
        raise UserError(f"{path}: no generations; run `rlkit eval MODEL --data FILE --n 4 --out {path}` first")
    return rows


def rescore(rows: list[dict[str, Any]], reward: str) -> None:
    """Replace each row's score with scorer `reward`'s score of its response against its ground truth."""
    from rlkit.reward.manager import RewardManager
    from rlkit.reward.registry import get_scorer

    get_scorer(reward)  # an unknown name fails here, naming the close matches
    sources = {str(r.get("data_source")) for r in rows}
    manager = RewardManager(scorer_overrides=dict.fromkeys(sources, reward))
    results = manager.score_texts([r["response"] for r in rows], [r.get("ground_truth") for r in rows],
                                  [str(r.get("data_source")) for r in rows])
    for row, result in zip(rows, results):
        row["score"] = result.score


def best_worst_pairs(rows: Sequence[dict[str, Any]], min_margin: float = 0.0) -> list[dict[str, Any]]:
    """One pair per prompt: its best and worst non-empty generation, when their scores differ by more than
    `min_margin`."""
    by_prompt: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        if not row["response"].strip():  # an empty reply is no completion to prefer or avoid
            continue
        by_prompt[int(row["prompt_index"])].append(row)
    pairs = []
    for index, samples in sorted(by_prompt.items()):
        best = max(samples, key=lambda r: r["score"])  # max/min keep the first of equals
        worst = min(samples, key=lambda r: r["score"])
        if best["score"] - worst["score"] <= min_margin or best["response"] == worst["response"]:
            continue
        pairs.append({
            "prompt": best["prompt"], "chosen": best["response"], "rejected": worst["response"],
            "chosen_score": float(best["score"]), "rejected_score": float(worst["score"]),
            "data_source": str(best.get("data_source")),
            "extra_info": {"prompt_index": index, "samples": len(samples)},
        })
    return pairs


@DATASETS.register("pairs")
def command(
    generations: Annotated[Path, typer.Argument(help="The JSONL `rlkit eval --n K` wrote (every sample, scored).")],
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Directory for train.parquet (and test.parquet); "
                                             "default: a 'pairs' folder next to the generations.")] = None,
    reward: Annotated[str | None, typer.Option("--reward", help="Re-score every response with this scorer (gsm8k, "
                                               "math, toy_copy, ...) instead of the score eval recorded.")] = None,
    min_margin: Annotated[float, typer.Option("--min-margin", min=0.0, help="Keep a prompt only when its best and "
                                              "worst scores differ by more than this.")] = 0.0,
    test_size: Annotated[int, typer.Option("--test-size", min=0, help="The last N pairs go to test.parquet "
                                           "(validation pairs for `rlkit train dpo`).")] = 0,
    force: opt.Force = False,
) -> None:
    """Preference pairs from a model's own scored generations: per prompt, best -> chosen, worst -> rejected.

    Example: [bold]rlkit eval ./sft_model --data train.parquet --n 8 --temperature 1 --out gen.jsonl && rlkit data
    pairs gen.jsonl --reward gsm8k --out ~/data/gsm8k_pairs --test-size 64[/bold]
    """
    generations = generations.expanduser()
    if not generations.is_file():
        raise UserError(f"{generations}: no such file; write one with `rlkit eval MODEL --data FILE --n 4 --out ...`")
    out = (out or generations.parent / "pairs").expanduser()
    paths = {"train": out / "train.parquet", **({"test": out / "test.parquet"} if test_size else {})}
    refuse_overwrite(paths.values(), force)
    rows = read_eval_rows(generations)
    if reward:
        rescore(rows, reward)
    pairs = best_worst_pairs(rows, min_margin)
    prompts = len({r["prompt_index"] for r in rows})
    if len(pairs) <= test_size:
        raise UserError(f"{generations}: {len(pairs)} of {prompts} prompts have a best reply scored above the worst "
                        f"by more than {min_margin}, not enough for --test-size {test_size}; sample more per prompt "
                        "(rlkit eval --n 8 --temperature 1) or lower --min-margin")
    splits = {"train": pairs[: len(pairs) - test_size], "test": pairs[len(pairs) - test_size:]}
    prepare_out_dir(out)
    for split, path in paths.items():
        write_pairs(splits[split], path)
    results = [SplitResult(split, len(splits[split]), path, splits[split][0]) for split, path in paths.items()]
    print_summary("pairs", f"{generations}: {len(pairs)} pairs from {prompts} prompts", results)


def write_pairs(pairs: list[dict[str, Any]], path: Path) -> None:
    """Write one split atomically, checked by the validator `rlkit train dpo` loads with."""
    table = pa.Table.from_pylist(pairs, schema=SCHEMA)
    errors = [p for p in validate_preference_table(table) if p.is_error]
    if errors:  # e.g. an empty response that scored best
        raise UserError(f"{path}: {errors[0]}; drop that prompt from the generations or raise --min-margin")
    write_table(table, path)
