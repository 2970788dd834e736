"""Python code problems with unit tests -> the common RL schema (data_source `rlkit/code`, `code` scorer).

Sources, in this order: `--source` (a .jsonl/.parquet file or a directory of split
files), the hub with `--hub` (MBPP, sanitized), else the handmade offline set in
data_prep/assets/code (37 problems, for tests and CPU recipes).

Accepted record shapes (one problem per record):

* rlkit / generic: {"problem", "tests": [assert ...], "solution"?, "entry_point"?, "task_id"?}
* MBPP:            {"text" | "prompt", "test_list", "code", "test_imports"? | "test_setup_code"?}
* HumanEval:       {"prompt", "test" (def check(candidate)), "entry_point", "canonical_solution"}

`--coevolve` writes two rows per problem, a coder row and a unit-tester row
(data_source `rlkit/code_tester`), next to each other, for the CURE-style
recipe (recipes/coevolve_code.sh; rlkit/reward/coevolve.py).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Any

import pyarrow as pa
import typer

from data_prep import options as opt
from data_prep.registry import DATASETS
from data_prep.runner import RowError, run
from data_prep.sources import HubDataset, Resolved, SplitRecords, resolve
from rlkit.data.schema import arrow_schema

DATA_SOURCE = "rlkit/code"
TESTER_DATA_SOURCE = "rlkit/code_tester"
SPLITS = ("train", "test")
HUB = HubDataset("google-research-datasets/mbpp", "sanitized", SPLITS)
SCHEMA = arrow_schema([
    pa.field("task_id", pa.string()),
    pa.field("entry_point", pa.string()),
    pa.field("solution", pa.string()),
    pa.field("role", pa.string()),
    pa.field("problem", pa.string()),
])  # fmt: skip

CODER_INSTRUCTION = (
    "Write the function in Python. Your code should pass tests like this one:\n{example}\n"
    "Answer with the complete function in one ```python code block."
)
TESTER_INSTRUCTION = (
    "Do not solve the problem. Write one unit test for a function `{entry}` that solves it: a single "
    "`assert` statement that a correct solution passes and a wrong one is likely to fail, e.g.\n{example}\n"
    "Answer with the assert in one ```python code block."
)
_ENTRY_IN_TEST = re.compile(r"\bassert\s+(?:not\s+)?\(?\s*([A-Za-z_]\w*)\s*\(")
_DEF = re.compile(r"^def\s+([A-Za-z_]\w*)\s*\(", re.MULTILINE)


def _text(record: dict[str, Any], *keys: str) -> str | None:
    for key in keys:
        value = record.get(key)
        if isinstance(value, str) and value.strip():
            return value
    return None


def normalize(record: dict[str, Any]) -> dict[str, Any]:
    """Any accepted record shape -> {task_id, problem, tests, solution, entry_point}."""
    if isinstance(record.get("test"), str) and "def check" in record["test"]:  # HumanEval
        entry = _text(record, "entry_point")
        if entry is None:
            raise RowError("a HumanEval-style record (with 'test') needs 'entry_point'")
        prompt = _text(record, "prompt") or ""
        problem = f"Complete this Python function:\n```python\n{prompt.rstrip()}\n```"
        tests = [f"{record['test']}\ncheck({entry})"]
        solution = prompt + (record.get("canonical_solution") or "") if record.get("canonical_solution") else None
    else:
        problem = _text(record, "problem", "text", "prompt", "question")
        tests = record.get("tests", record.get("test_list"))
        if problem is None:
            raise RowError("no problem text: give 'problem' (or 'text' / 'prompt' / 'question')")
        if not isinstance(tests, (list, tuple)) or not tests or not all(isinstance(t, str) for t in tests):
            raise RowError("no tests: give 'tests' (or 'test_list'), a non-empty list of assert strings")
        setup = "\n".join(record.get("test_imports") or []) or (record.get("test_setup_code") or "")
        tests = [f"{setup}\n{t}" if setup.strip() else t for t in tests]
        solution = _text(record, "solution", "code")
        entry = _text(record, "entry_point")
        if entry is None:
            found = _ENTRY_IN_TEST.search(tests[0]) or (_DEF.search(solution) if solution else None)
            entry = found.group(1) if found else ""
    task_id = record.get("task_id")
    return {
        "task_id": str(task_id) if task_id is not None else None,
        "problem": problem.strip(),
        "tests": [str(t) for t in tests],
        "solution": solution,
        "entry_point": entry,
    }


def _example(tests: list[str]) -> str:
    first = tests[0].strip()
    return first if len(first) <= 400 else first[:400] + " ..."


def coder_row(p: dict[str, Any], split: str, index: int) -> dict[str, Any]:
    text = CODER_INSTRUCTION.format(example=_example(p["tests"]))
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"{p['problem']}\n\n{text}"}],
        "ability": "code",
        "reward_model": {"style": "rule", "ground_truth": json.dumps({"tests": p["tests"]})},
        "extra_info": {"split": split, "index": index, "task_id": p["task_id"], "entry_point": p["entry_point"],
                       "solution": p["solution"], "role": "coder", "problem": p["problem"]},
    }  # fmt: skip


def tester_row(p: dict[str, Any], split: str, index: int) -> dict[str, Any]:
    text = TESTER_INSTRUCTION.format(entry=p["entry_point"] or "the function", example=_example(p["tests"]))
    row = coder_row(p, split, index)
    row["data_source"] = TESTER_DATA_SOURCE
    row["prompt"] = [{"role": "user", "content": f"{p['problem']}\n\n{text}"}]
    row["extra_info"] = {**row["extra_info"], "role": "tester"}
    return row


def make_row(record: dict[str, Any], split: str, index: int) -> dict[str, Any]:
    return coder_row(normalize(record), split, index)


def _paired(resolved: Resolved) -> Resolved:
    """Coder and tester rows of each problem side by side (record 2i -> coder, 2i+1 -> tester)."""
    splits = {}
    for name, records in resolved.splits.items():
        doubled = SplitRecords(name)
        pairs = []
        for i, rec in enumerate(records.records):
            pairs += [(i, {**rec, "_role": "coder"}), (i, {**rec, "_role": "tester"})]
        doubled.add(records.origins[0] if records.origins else name, pairs)
        splits[name] = doubled
    return Resolved(splits, resolved.description + " (coder + tester rows per problem)")


def make_paired_row(record: dict[str, Any], split: str, index: int) -> dict[str, Any]:
    role = record.get("_role", "coder")
    p = normalize(record)
    if role == "tester" and not p["entry_point"]:
        raise RowError("the tester prompt needs the function name: give 'entry_point'")
    return (tester_row if role == "tester" else coder_row)(p, split, index // 2)


@DATASETS.register("code")
def command(
    out: opt.Out = Path("~/data/code"),
    source: opt.Source = None,
    split: opt.Split = None,
    hub: Annotated[bool, typer.Option("--hub/--no-hub", help="Without --source, use MBPP (sanitized) from the "
                                      "Hugging Face hub instead of the handmade offline set.")] = False,
    coevolve: Annotated[bool, typer.Option("--coevolve", help="Two rows per problem: coder and unit tester "
                                           "(for recipes/coevolve_code.sh).")] = False,
    limit: opt.Limit = None,
    seed: opt.Seed = 0,
    force: opt.Force = False,
) -> None:
    """Python problems with assert tests -> train/test parquet, scored by the `code` scorer (pass fraction).

    Example: [bold]rlkit data code --out ~/data/code[/bold] (handmade offline set),
    [bold]rlkit data code --hub --out ~/data/mbpp[/bold] (MBPP), or
    [bold]rlkit data code --source problems.jsonl --out /tmp/c[/bold] (jsonl with problem/tests per line)
    """
    resolved = resolve(
        source=source, splits=SPLITS, split=split, hub=HUB, use_hub=hub, packaged="code", dataset="code"
    )
    if coevolve:
        resolved = _paired(resolved)
    run(
        dataset="code",
        resolved=resolved,
        make_row=make_paired_row if coevolve else make_row,
        schema=SCHEMA,
        opts=opt.PrepOptions(out=out, limit=limit, seed=seed, force=force),
    )
