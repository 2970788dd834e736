"""math (math-verify equivalence) and toy_copy scorers."""

from __future__ import annotations

import threading

import pytest

from rlkit.reward.math_equiv import last_boxed, math_score
from rlkit.reward.toy_copy import toy_copy_score

EQUIVALENT = [
    ("\\frac{1}{2}", "so the answer is \\boxed{0.5}"),
    ("\\dfrac{3}{4}", "\\boxed{\\frac34}"),
    ("\\frac{\\sqrt{3}}{3}", "\\boxed{\\frac{1}{\\sqrt{3}}}"),
    ("2\\sqrt{2}", "\\boxed{\\sqrt{8}}"),
    ("(1,3]", "The set is \\boxed{(1,3]}."),
    ("(-\\infty, 2) \\cup (3, \\infty)", "\\boxed{(-\\infty,2)\\cup(3,\\infty)}"),
    ("x^2+2x+1", "\\boxed{(x+1)^2}"),
    ("5", "first \\boxed{4}, no wait: \\boxed{5}"),
]
DIFFERENT = [
    ("\\frac{1}{2}", "\\boxed{\\frac{1}{3}}"),
    ("2\\sqrt{2}", "\\boxed{\\sqrt{2}}"),
    ("(1,3]", "\\boxed{[1,3]}"),
    ("3", "\\boxed{3} and then \\boxed{4}"),
    ("5", "the answer is 5"),  # no box, no answer
]


@pytest.mark.parametrize("gt,response", EQUIVALENT)
def test_equivalent(gt, response):
    assert math_score(response, gt)["score"] == 1.0


@pytest.mark.parametrize("gt,response", DIFFERENT)
def test_not_equivalent(gt, response):
    assert math_score(response, gt)["score"] == 0.0


def test_math_works_off_the_main_thread():
    """math-verify's signal timeout fails in threads; the scorer must switch it off there."""
    out = {}
    t = threading.Thread(target=lambda: out.update(math_score("\\boxed{\\sqrt{8}}", "2\\sqrt{2}")))
    t.start()
    t.join()
    assert out["score"] == 1.0


def test_math_extras_and_format_score():
    assert math_score("no box", "1") == {"score": 0.0, "acc": 0.0, "has_answer": 0.0}
    assert math_score("\\boxed{2}", "1", format_score=0.1)["score"] == 0.1
    assert last_boxed("a \\boxed{1} b \\boxed{2}") == "\\boxed{2}"


@pytest.mark.parametrize(
    "response,gt,expected",
    [
        ("4 1 7", "4 1 7", 1.0),
        ("417", "4 1 7", 1.0),
        ("4 1 7 <junk> the end", "4 1 7", 1.0),
        ("4 1 7 9", "4 1 7", 0.75),  # extra digits are penalised
        ("4 1", "4 1 7", 2 / 3),
        ("7 1 4", "4 1 7", 1 / 3),
        ("", "4 1 7", 0.0),
        ("copy the digits", "4 1 7", 0.0),
    ],
)
def test_toy_copy(response, gt, expected):
    out = toy_copy_score(response, gt, None)
    assert out["score"] == pytest.approx(expected)
    assert out["exact"] == float(expected == 1.0)
