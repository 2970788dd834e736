"""`rlkit reward score` through typer's CliRunner."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from rlkit_cli.main import app

runner = CliRunner()


def _flat(res) -> str:
    """The output with rich's line wrapping undone."""
    return " ".join(res.output.split())


def _write(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_scores_a_file_and_prints_a_summary(tmp_path):
    src = _write(
        tmp_path / "in.jsonl",
        [
            {"data_source": "openai/gsm8k", "response": "so #### 1,000", "ground_truth": "1000"},
            {"data_source": "openai/gsm8k", "response": "The answer is 7.", "ground_truth": "7"},
            {"data_source": "lighteval/MATH", "response": "\\boxed{\\frac{2}{4}}", "ground_truth": "\\frac12"},
            {
                "data_source": "rlkit/code",
                "response": "```python\ndef f(x):\n    return x * 2\n```",
                "ground_truth": "",
                "extra_info": {"tests": ["assert f(2) == 4", "assert f(3) == 7"]},
            },
        ],
    )
    out = tmp_path / "out.jsonl"
    res = runner.invoke(app, ["reward", "score", str(src), "--out", str(out)])
    assert res.exit_code == 0, res.output
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["score"] for r in rows] == [1.0, 0.0, 1.0, 0.5]
    assert rows[0]["reward_extra"]["pred"] == "1,000"
    assert rows[3]["reward_extra"]["error"] == "wrong_answer"
    assert "openai/gsm8k" in res.output and "0.5000" in res.output

    res = runner.invoke(app, ["reward", "score", str(src), "--out", str(out), "--method", "flexible"])
    assert res.exit_code == 0, res.output
    assert [json.loads(x)["score"] for x in out.read_text().splitlines()][:2] == [1.0, 1.0]


def test_default_output_path_and_custom_function(tmp_path):
    fn = tmp_path / "rw.py"
    fn.write_text("async def length_score(response, ground_truth, extra_info):\n    return len(response) / 10\n")
    src = _write(tmp_path / "in.jsonl", [{"data_source": "mine", "response": "abcde", "ground_truth": ""}])
    res = runner.invoke(app, ["reward", "score", str(src), "--custom-path", str(fn), "--custom-name", "length_score"])
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "in.scored.jsonl").read_text())["score"] == 0.5


def test_errors_name_the_line(tmp_path):
    good = {"data_source": "openai/gsm8k", "response": "#### 1", "ground_truth": "1"}
    src = _write(tmp_path / "bad.jsonl", [good, "{not json"])
    res = runner.invoke(app, ["reward", "score", str(src)])
    assert res.exit_code == 1 and "line 2" in _flat(res) and "not valid JSON" in _flat(res)

    src = _write(tmp_path / "missing.jsonl", [good, {"data_source": "openai/gsm8k", "response": "x"}])
    res = runner.invoke(app, ["reward", "score", str(src)])
    assert res.exit_code == 1 and "line 2" in _flat(res) and "ground_truth" in _flat(res)

    res = runner.invoke(app, ["reward", "score", str(tmp_path / "nope.jsonl")])
    assert res.exit_code == 1 and "not found" in _flat(res)

    src = _write(tmp_path / "ds.jsonl", [{"data_source": "who/knows", "response": "x", "ground_truth": "1"}])
    res = runner.invoke(app, ["reward", "score", str(src)])
    assert res.exit_code == 1 and "who/knows" in _flat(res)

    res = runner.invoke(app, ["reward", "score", str(src), "--custom-path", str(tmp_path / "none.py")])
    assert res.exit_code == 1 and "custom_reward_function.path" in _flat(res)


def test_help_has_an_example():
    res = runner.invoke(app, ["reward", "score", "--help"])
    assert res.exit_code == 0 and "Example" in res.output and "rlkit reward score" in res.output
