"""`rlkit data inspect`: exit 0 on a valid file, exit 1 listing each problem with row and column."""

from __future__ import annotations

import pandas as pd
import pyarrow as pa
import pytest

from .conftest import toy_row


def flat(text: str) -> str:
    return " ".join(text.split())


def test_valid_file_exits_0_and_prints_rows(cli, write_parquet):
    path = write_parquet([toy_row(i, f"{i} {i} {i}") for i in range(5)])
    result = cli("data", "inspect", path, "-n", 2)
    assert result.exit_code == 0, result.output
    out = flat(result.output)
    assert "valid: 5 rows" in out and "row 0" in out and "row 1" in out and "row 2" not in out
    assert "copy the digits : 1 1 1" in out
    assert "copy the digits : 2 2 2" not in out
    assert cli("data", "inspect", path, "-n", 0).exit_code == 0


def test_a_generated_file_inspects_clean(cli, tmp_path):
    assert cli("data", "toy", "--out", tmp_path, "--train-size", 8, "--test-size", 2).exit_code == 0
    result = cli("data", "inspect", tmp_path / "train.parquet")
    assert result.exit_code == 0 and "warning" not in result.output and "valid: 8 rows" in flat(result.output)


def test_verl_style_pandas_file_is_valid(cli, tmp_path):
    """Another toolkit's gsm8k layout (pandas-written, other extra_info fields, tools_kwargs) passes."""
    frame = pd.DataFrame(
        [
            {
                "data_source": "openai/gsm8k",
                "prompt": [{"content": "What is 2+2? Let's think.", "role": "user"}],
                "ability": "math",
                "reward_model": {"ground_truth": "4", "style": "rule"},
                "extra_info": {"answer": "2+2=4\n#### 4", "index": 0, "question": "What is 2+2?", "split": "train"},
                "tools_kwargs": {"calculator": {"create_kwargs": {"x": 1}}},
            }
        ]
    )
    frame.to_parquet(tmp_path / "verl.parquet")
    result = cli("data", "inspect", tmp_path / "verl.parquet")
    assert result.exit_code == 0, result.output
    assert "extra column" in result.output  # reported, not fatal
    strict = cli("data", "inspect", tmp_path / "verl.parquet", "--strict")
    assert strict.exit_code == 1 and "column 'tools_kwargs': extra column" in flat(strict.output)


BROKEN = {
    "missing column": (
        [{k: v for k, v in toy_row(0).items() if k != "ability"}],
        ["column 'ability': column is missing"],
    ),
    "non-list prompt": (
        [toy_row(0, prompt="copy the digits : 1 2 3")],
        ["column 'prompt': has type string, expected list<struct<role, content>>"],
    ),
    "list of strings prompt": (
        [toy_row(0, prompt=["copy the digits"])],
        ["column 'prompt': items have type string"],
    ),
    "unknown role": (
        [toy_row(0), toy_row(1, prompt=[{"role": "usr", "content": "hi"}])],
        ["row 1, column 'prompt[0].role': unknown role 'usr'"],
    ),
    "empty ground truth": (
        [toy_row(0), toy_row(1), toy_row(2, reward_model={"style": "rule", "ground_truth": " "})],
        ["row 2, column 'reward_model.ground_truth': is empty"],
    ),
    "reward_model not a struct": (
        [toy_row(0, reward_model="1 2 3")],
        ["column 'reward_model': has type string, expected struct<style, ground_truth>"],
    ),
    "no ground_truth field": (
        [toy_row(0, reward_model={"style": "rule", "answer": "1"})],
        ["column 'reward_model.ground_truth': field is missing"],
    ),
    "extra_info not a struct": (
        [toy_row(0, extra_info="train")],
        ["column 'extra_info': has type string, expected a struct"],
    ),
    "null data_source and empty prompt": (
        [toy_row(0, data_source=None), toy_row(1, prompt=[])],
        ["row 0, column 'data_source': is null or empty", "row 1, column 'prompt': has no messages"],
    ),
    "null content": (
        [toy_row(0, prompt=[{"role": "user", "content": None}])],
        ["row 0, column 'prompt[0].content': is null"],
    ),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_files_exit_1_listing_problems(cli, write_parquet, case):
    rows, expected = BROKEN[case]
    result = cli("data", "inspect", write_parquet(rows))
    assert result.exit_code == 1, result.output
    out = flat(result.output)
    for text in expected:
        assert text in out
    assert "invalid:" in out and "Traceback" not in result.output


def test_every_problem_is_listed(cli, write_parquet):
    rows = [toy_row(i, prompt=[{"role": "bot", "content": "x"}]) for i in range(30)]
    result = cli("data", "inspect", write_parquet(rows), "--max-problems", 25)
    assert result.exit_code == 1
    out = flat(result.output)
    assert "row 24, column 'prompt[0].role'" in out and "and 5 more errors" in out
    assert "invalid: 30 problems" in out


def test_no_rows(cli, write_parquet):
    schema = pa.Table.from_pylist([toy_row(0)]).schema
    result = cli("data", "inspect", write_parquet([], schema=schema))
    assert result.exit_code == 1 and "file has no rows" in flat(result.output)


@pytest.mark.parametrize(
    "content, expected",
    [(b"", "file is empty (0 bytes)"), (b"not parquet at all", "not a readable parquet file"), (None, "not found")],
)
def test_unreadable_files(cli, tmp_path, content, expected):
    path = tmp_path / "x.parquet"
    if content is not None:
        path.write_bytes(content)
    result = cli("data", "inspect", path)
    assert result.exit_code == 1
    assert expected in flat(result.output) and str(path) in flat(result.output)
    assert "Traceback" not in result.output
