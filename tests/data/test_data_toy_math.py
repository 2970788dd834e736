"""`rlkit data toy` and `rlkit data math`: formats the rest of rlkit relies on, options, bad input."""

from __future__ import annotations

import json
import re

import pyarrow.parquet as pq
import pytest

from data_prep import math as math_prep
from data_prep import toy
from data_prep.math import last_boxed
from rlkit.data.schema import validate_table


def flat(text: str) -> str:
    return " ".join(text.split())


# ------------------------------------------------------------------ toy
def test_toy_defaults_and_format(cli, tmp_path, tokenizer):
    result = cli("data", "toy", "--out", tmp_path)
    assert result.exit_code == 0, result.output
    train, test = (pq.read_table(tmp_path / f"{s}.parquet") for s in ("train", "test"))
    assert (train.num_rows, test.num_rows) == (2048, 128)
    assert validate_table(train) == [] and train.schema == toy.SCHEMA
    for split, table in (("train", train), ("test", test)):
        for i, row in enumerate(table.to_pylist()):
            content = row["prompt"][0]["content"]
            match = re.fullmatch(r"copy the digits : (\d) (\d) (\d)", content)
            assert match, content
            assert row["prompt"] == [{"role": "user", "content": content}]
            assert row["reward_model"] == {"style": "rule", "ground_truth": " ".join(match.groups())}
            assert (row["data_source"], row["ability"]) == ("rlkit/toy_copy", "toy")
            assert row["extra_info"] == {"split": split, "index": i}
    # every word is in the tiny tokenizer's vocabulary
    contents = [r[0]["content"] for r in train.column("prompt").to_pylist()]
    ids = tokenizer(contents, add_special_tokens=False)["input_ids"]
    assert tokenizer.unk_token_id not in {t for seq in ids for t in seq}
    assert {len(seq) for seq in ids} == {7}
    assert len(set(contents)) > 500  # really random, not one repeated prompt


def test_toy_options_and_seed(cli, tmp_path):
    args = ("data", "toy", "--length", 5, "--train-size", 10, "--test-size", 4)
    assert cli(*args, "--out", tmp_path / "a", "--seed", 7).exit_code == 0
    assert cli(*args, "--out", tmp_path / "b", "--seed", 7).exit_code == 0
    assert cli(*args, "--out", tmp_path / "c", "--seed", 8).exit_code == 0
    a, b, c = (pq.read_table(tmp_path / d / "train.parquet") for d in "abc")
    assert a.num_rows == 10 and pq.read_metadata(tmp_path / "a" / "test.parquet").num_rows == 4
    assert a.equals(b) and not a.equals(c)
    assert all(len(r["ground_truth"].split()) == 5 for r in a.column("reward_model").to_pylist())
    limited = cli(*args, "--out", tmp_path / "d", "--limit", 3)
    assert limited.exit_code == 0
    assert pq.read_metadata(tmp_path / "d" / "train.parquet").num_rows == 3
    # train rows do not depend on the test size (separate RNG streams)
    other_test_size = ("data", "toy", "--length", 5, "--train-size", 10, "--test-size", 9, "--seed", 7)
    assert cli(*other_test_size, "--out", tmp_path / "e").exit_code == 0
    assert pq.read_table(tmp_path / "e" / "train.parquet").equals(a)


def test_toy_force_refusal(cli, tmp_path):
    assert cli("data", "toy", "--out", tmp_path, "--train-size", 4, "--test-size", 2).exit_code == 0
    again = cli("data", "toy", "--out", tmp_path, "--train-size", 4, "--test-size", 2)
    assert again.exit_code == 1 and "pass --force" in flat(again.output)
    assert cli("data", "toy", "--out", tmp_path, "--train-size", 4, "--test-size", 2, "-f").exit_code == 0


def test_out_is_a_file(cli, tmp_path):
    (tmp_path / "f").write_text("x")
    result = cli("data", "toy", "--out", tmp_path / "f")
    assert result.exit_code == 1 and "is a file" in flat(result.output)


# ------------------------------------------------------------------ math
@pytest.mark.parametrize(
    "text, expected",
    [
        (r"so $\boxed{5}$.", "5"),
        (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),
        (r"first \boxed{1} then \boxed{2}", "2"),
        (r"\boxed{\{1, 2\}}", r"\{1, 2\}"),
        (r"\boxed{a \\ b}", r"a \\ b"),
        (r"\fbox{x^{2}}", "x^{2}"),
        (r"the answer is $\boxed 7$", "7"),
        (r"\boxed{\text{(A)}}", r"\text{(A)}"),
        (r"\boxed{unbalanced", None),
        (r"\boxed{}", None),
        ("no box here", None),
    ],
)
def test_last_boxed(text, expected):
    assert last_boxed(text) == expected


MATH_ROWS = [
    {"problem": "What is $1+1$?", "solution": r"We add: $\boxed{2}$.", "subject": "Algebra", "level": 1},
    {"problem": "Half of one?", "solution": r"It is $\boxed{\frac{1}{2}}$."},
    {"problem": "Pick.", "solution": r"\boxed{wrong}", "answer": r"\text{(B)}"},
    {"problem": "Solve.", "solution": "", "answer": "3"},
]


def test_math_from_a_handmade_jsonl(cli, tmp_path):
    src = tmp_path / "test.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in MATH_ROWS))
    result = cli("data", "math", "--source", src, "--out", tmp_path / "out")
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["test.parquet"]
    table = pq.read_table(tmp_path / "out" / "test.parquet")
    assert table.schema == math_prep.SCHEMA and validate_table(table) == []
    rows = table.to_pylist()
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["2", r"\frac{1}{2}", r"\text{(B)}", "3"]
    assert {r["data_source"] for r in rows} == {"HuggingFaceH4/MATH-500"}
    assert {r["ability"] for r in rows} == {"math"}
    assert rows[0]["prompt"] == [{"role": "user", "content": f"What is $1+1$? {math_prep.INSTRUCTION}"}]
    assert rows[0]["extra_info"] == {
        "split": "test",
        "index": 0,
        "problem": "What is $1+1$?",
        "solution": r"We add: $\boxed{2}$.",
        "answer": None,
        "subject": "Algebra",
        "level": "1",
    }


def test_math_data_source_limit_and_split(cli, tmp_path):
    src = tmp_path / "mine.jsonl"
    src.write_text("".join(json.dumps(r | {"data_source": "lighteval/MATH"}) + "\n" for r in MATH_ROWS))
    result = cli("data", "math", "--source", src, "--out", tmp_path / "a", "--limit", 2)
    assert result.exit_code == 0, result.output
    table = pq.read_table(tmp_path / "a" / "train.parquet")  # not a split name -> train
    assert table.num_rows == 2 and set(table.column("data_source").to_pylist()) == {"lighteval/MATH"}
    result = cli("data", "math", "--source", src, "--out", tmp_path / "b", "--data-source", "x/y", "--split", "test")
    assert result.exit_code == 0, result.output
    assert set(pq.read_table(tmp_path / "b" / "test.parquet").column("data_source").to_pylist()) == {"x/y"}


def test_math_bad_rows_and_no_source(cli, tmp_path):
    src = tmp_path / "test.jsonl"
    src.write_text(json.dumps(MATH_ROWS[0]) + "\n" + json.dumps({"problem": "p", "solution": "no box"}) + "\n")
    result = cli("data", "math", "--source", src, "--out", tmp_path / "out")
    assert result.exit_code == 1
    assert f"{src} line 2: no final answer" in flat(result.output)
    src.write_text(json.dumps({"question": "wrong field"}) + "\n")
    result = cli("data", "math", "--source", src, "--out", tmp_path / "out")
    assert result.exit_code == 1 and "line 1: field 'problem' is missing" in flat(result.output)
    result = cli("data", "math", "--no-hub", "--out", tmp_path / "out")
    assert result.exit_code == 1 and "pass --source PATH" in flat(result.output)
    assert "Traceback" not in result.output


def test_every_command_has_help_with_an_example(cli):
    from data_prep.registry import load_datasets

    names = load_datasets().names()
    assert {"gsm8k", "math", "toy"} <= set(names)
    for name in [*names, "inspect"]:
        result = cli("data", name, "--help")
        assert result.exit_code == 0 and "Example" in result.output, name
