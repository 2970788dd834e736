"""gsm8k scorer: the real test split's answers, and strict/flexible edge cases."""

from __future__ import annotations

import json

import pytest

from data_prep.sources import packaged_dir
from rlkit.errors import UserError
from rlkit.reward.gsm8k import extract_answer, gsm8k_score

# The GSM8K test split shipped with the package (data_prep/assets/gsm8k): present on every clone.
GSM8K_TEST = packaged_dir("gsm8k") / "test.jsonl"


def test_every_test_answer_scores_against_its_own_number():
    lines = GSM8K_TEST.read_text(encoding="utf-8").splitlines()
    assert len(lines) > 1000
    for lineno, line in enumerate(lines, start=1):
        answer = json.loads(line)["answer"]
        gt = answer.rsplit("####", 1)[1].strip().replace(",", "")
        wrong = str(int(float(gt)) + 1)
        for method in ("strict", "flexible"):
            assert gsm8k_score(answer, gt, None, method=method)["score"] == 1.0, (lineno, method, gt)
            assert gsm8k_score(answer, wrong, None, method=method)["score"] == 0.0, (lineno, method)


@pytest.mark.parametrize(
    "text,method,expected",
    [
        ("so #### 1,234", "strict", "1234"),
        ("#### $1,000,000.00", "strict", "1000000"),
        ("#### -5", "strict", "-5"),
        ("#### -$5", "strict", "-5"),
        ("#### 3.50.", "strict", "3.5"),
        ("#### 7 then #### 8", "strict", "8"),
        ("The answer is 42.", "strict", None),  # strict needs ####
        ("The answer is 42.", "flexible", "42"),
        ("It costs $1,234.50 in total.", "flexible", "1234.5"),
        ("the change is -3 degrees", "flexible", "-3"),
        ("ages 5-10", "flexible", "10"),  # a range's dash is not a sign
        ("0.25 of 8 is 2.0", "flexible", "2"),
        ("no numbers here", "flexible", None),
        ("", "strict", None),
    ],
)
def test_extraction(text, method, expected):
    from rlkit.reward.gsm8k import to_number

    got = extract_answer(text, method)
    if expected is None:
        assert got is None
    else:
        assert to_number(got) == to_number(expected)


def test_scores_and_format_score():
    assert gsm8k_score("#### 18", "18")["score"] == 1.0
    assert gsm8k_score("#### 18.0", "18")["score"] == 1.0
    assert gsm8k_score("#### 17", "18", format_score=0.1)["score"] == 0.1
    assert gsm8k_score("no answer", "18", format_score=0.1)["score"] == 0.0
    assert gsm8k_score("#### 18", "18", score=2.0)["score"] == 2.0
    assert gsm8k_score("The total is 1,000.", "1000", method="flexible")["score"] == 1.0
    assert gsm8k_score("#### 5", "#### 5")["acc"] == 1.0  # a full solution as ground truth
    out = gsm8k_score("x #### 3", "4")
    assert out == {"score": 0.0, "acc": 0.0, "pred": "3"}


def test_bad_method_and_ground_truth():
    with pytest.raises(UserError, match="strict"):
        gsm8k_score("#### 1", "1", method="loose")
    with pytest.raises(UserError, match="not a number"):
        gsm8k_score("#### 1", "one")
