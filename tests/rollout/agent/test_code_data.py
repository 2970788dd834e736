"""`rlkit data code`: the handmade offline set, --source with MBPP/HumanEval-style records, --coevolve pairs."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from data_prep.code import normalize
from data_prep.sources import packaged_dir
from rlkit.data.schema import validate_table
from rlkit.reward.code import code_score
from rlkit.reward.registry import scorer_name_for
from rlkit_cli.main import app


def cli(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def test_handmade_set_solutions_pass_their_tests():
    """Every shipped reference solution passes all of its tests in the sandbox (the `code` scorer)."""
    from concurrent.futures import ThreadPoolExecutor

    records = [json.loads(line) for split in ("train", "test")
               for line in (packaged_dir("code") / f"{split}.jsonl").read_text().splitlines()]
    assert 20 <= len(records) <= 40 and len({r["task_id"] for r in records}) == len(records)
    assert all(len(r["tests"]) >= 3 for r in records)

    def score(r):
        # generous limits: this checks the solutions, not their speed (a loaded CI machine timed one out at 3 s)
        return code_score(f"```python\n{r['solution']}```", json.dumps({"tests": r["tests"]}), timeout_s=30.0,
                          total_timeout_s=120.0)["score"]

    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(score, records)) == [1.0] * len(records)
    wrong_answer = "```python\ndef add_numbers(a, b):\n    return a - b\n```"
    wrong = code_score(wrong_answer, json.dumps({"tests": records[0]["tests"]}))
    assert wrong["score"] < 1.0


def test_rlkit_data_code_offline(tmp_path):
    result = cli("data", "code", "--out", tmp_path)
    assert result.exit_code == 0, result.output
    train, test = (pq.read_table(tmp_path / f"{s}.parquet") for s in ("train", "test"))
    assert (train.num_rows, test.num_rows) == (30, 7)
    assert validate_table(train) == []
    row = train.to_pylist()[0]
    assert row["data_source"] == "rlkit/code" and scorer_name_for(row["data_source"]) == "code"
    assert row["ability"] == "code" and row["extra_info"]["role"] == "coder"
    tests = json.loads(row["reward_model"]["ground_truth"])["tests"]
    assert tests[0] in row["prompt"][0]["content"], "the prompt shows one test (name and signature)"
    solution = row["extra_info"]["solution"]
    assert code_score(f"```python\n{solution}```", row["reward_model"]["ground_truth"])["score"] == 1.0


def test_rlkit_data_code_coevolve_pairs(tmp_path):
    result = cli("data", "code", "--out", tmp_path, "--coevolve", "--limit", "6")
    assert result.exit_code == 0, result.output
    rows = pq.read_table(tmp_path / "train.parquet").to_pylist()
    assert [r["extra_info"]["role"] for r in rows] == ["coder", "tester"] * 3
    assert [r["data_source"] for r in rows[:2]] == ["rlkit/code", "rlkit/code_tester"]
    for coder, tester in zip(rows[::2], rows[1::2]):
        assert coder["extra_info"]["task_id"] == tester["extra_info"]["task_id"]
        assert coder["reward_model"] == tester["reward_model"]
        assert "Do not solve the problem" in tester["prompt"][0]["content"]
        assert tester["extra_info"]["entry_point"] in tester["prompt"][0]["content"]


def test_source_with_mbpp_and_humaneval_records(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    mbpp = {"task_id": 2, "text": "Write a function to square a number.", "code": "def sq(x):\n    return x * x",
            "test_list": ["assert sq(3) == 9", "assert sq(0) == 0"], "test_imports": ["import math"]}
    humaneval = {"task_id": "HumanEval/0", "prompt": "def inc(x):\n    \"\"\"x + 1\"\"\"\n",
                 "canonical_solution": "    return x + 1\n", "entry_point": "inc",
                 "test": "def check(candidate):\n    assert candidate(1) == 2\n"}
    (src / "train.jsonl").write_text(json.dumps(mbpp) + "\n" + json.dumps(humaneval) + "\n")
    result = cli("data", "code", "--source", src, "--out", tmp_path / "out")
    assert result.exit_code == 0, result.output
    rows = pq.read_table(tmp_path / "out" / "train.parquet").to_pylist()
    for row in rows:
        sol = row["extra_info"]["solution"]
        assert code_score(f"```python\n{sol}```", row["reward_model"]["ground_truth"])["score"] == 1.0
    assert rows[0]["extra_info"]["entry_point"] == "sq"
    assert json.loads(rows[0]["reward_model"]["ground_truth"])["tests"][0].startswith("import math\n")
    assert rows[1]["extra_info"]["entry_point"] == "inc" and "def inc(x)" in rows[1]["prompt"][0]["content"]


def test_bad_records_name_the_line(tmp_path):
    (tmp_path / "bad.jsonl").write_text(json.dumps({"problem": "p", "tests": []}) + "\n")
    result = cli("data", "code", "--source", tmp_path / "bad.jsonl", "--out", tmp_path / "out")
    assert result.exit_code == 1
    assert "bad.jsonl line 1" in result.output and "tests" in result.output
    with pytest.raises(ValueError, match="problem"):
        normalize({"tests": ["assert True"]})
