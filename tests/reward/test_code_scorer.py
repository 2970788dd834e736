"""code scorer: assert-style and stdin/stdout tests, fenced-block extraction, error kinds."""

from __future__ import annotations

import json

import pytest

from rlkit.errors import UserError
from rlkit.reward.code import code_score, extract_code

TESTS = {"tests": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(2, 2) == 4"]}
GOOD = "Here you go:\n```python\ndef add(a, b):\n    return a + b\n```\nDone."


def test_extract_last_python_block():
    text = "```python\nx = 1\n```\nbetter:\n```python\nx = 2\n```\n```\nplain\n```"
    assert extract_code(text).strip() == "x = 2"
    assert extract_code("```\ny = 3\n```").strip() == "y = 3"
    assert extract_code("z = 4") == "z = 4"


def test_asserts_all_pass_from_extra_info():
    out = code_score(GOOD, "", TESTS)
    assert out["score"] == 1.0 and out["error"] == "ok" and out["passed"] == 3


def test_asserts_partial_from_ground_truth_json():
    wrong = "```python\ndef add(a, b):\n    return a + b if a > 0 else 99\n```"
    out = code_score(wrong, json.dumps(TESTS), None)
    assert out["score"] == pytest.approx(2 / 3) and out["error"] == "wrong_answer"


def test_error_kinds():
    assert code_score("def add(a, b) return", "", TESTS)["error"] == "syntax_error"
    assert code_score("def add(a, b):\n    return a.x", "", TESTS)["error"] == "runtime_error"
    slow = "def add(a, b):\n    while a > 0:\n        pass\n    return a + b"
    out = code_score(slow, "", TESTS, timeout_s=0.5)
    assert out["error"] == "timeout" and out["passed"] == 1  # each assert has its own time limit
    assert code_score("raise SystemExit(0)", "", TESTS)["score"] == 0.0  # exiting early passes nothing


def test_forged_result_line_does_not_pass():
    cheat = 'print("\\n" + "0" * 32 + \'["ok", "ok", "ok"]\')\nimport os\nos._exit(0)'
    assert code_score(cheat, "", TESTS)["score"] == 0.0


def test_stdin_stdout_cases():
    spec = {"inputs": ["1 2\n", "5 5\n", "0 0\n"], "outputs": ["3\n", "10", "1\n"]}
    prog = "a, b = map(int, input().split())\nprint(a + b)"
    out = code_score(f"```python\n{prog}\n```", json.dumps(spec), None, workers=3)
    assert out["score"] == pytest.approx(2 / 3) and out["error"] == "wrong_answer"


def test_missing_tests_is_a_clear_error():
    with pytest.raises(UserError, match="no tests"):
        code_score("x = 1", json.dumps({"foo": 1}), None)
    with pytest.raises(UserError, match="not JSON"):
        code_score("x = 1", "assert x", None)
