"""`gsm8k` scorer: the final number of a response against the ground truth.

`method="strict"` reads only the last `#### N` (the format the prompt asks for),
`"flexible"` the last number anywhere. Numbers are compared as numbers, so
`1,000`, `$1000`, `1000.` and `1000.00` all equal `1000`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

from rlkit.errors import UserError
from rlkit.reward.registry import SCORERS

# A sign (not a binary minus as in "3-1"), an optional "$", then 1,234,567 or 1234567 and an optional decimal part
_SIGN = r"(?:(?<![\w)\]])-)?"
_NUMBER = _SIGN + r"(?:\$\s?-?)?(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)"
_STRICT = re.compile(r"####\s*(" + _NUMBER + ")")
_FLEXIBLE = re.compile(_NUMBER)


def to_number(text: str) -> Decimal | None:
    """'$-1,234.50.' -> Decimal('-1234.50'); None when it is not a number."""
    cleaned = re.sub(r"[\s,$]", "", text).rstrip(".")
    negative = cleaned.count("-") % 2 == 1
    cleaned = cleaned.replace("-", "")
    try:
        value = Decimal(cleaned)
    except InvalidOperation:
        return None
    return -value if negative else value


def extract_answer(text: str, method: str = "strict") -> str | None:
    """The answer string a GSM8K response commits to, or None."""
    if method == "strict":
        found = _STRICT.findall(text)
    elif method == "flexible":
        found = _FLEXIBLE.findall(text)
    else:
        raise UserError(f"gsm8k scorer: method must be 'strict' or 'flexible', got '{method}'")
    return found[-1].strip() if found else None


def _ground_truth_number(ground_truth: Any) -> Decimal | None:
    text = str(ground_truth)
    if "####" in text:  # a full GSM8K solution was given as ground truth
        text = text.rsplit("####", 1)[1]
    return to_number(text.strip())


@SCORERS.register("gsm8k")
def gsm8k_score(
    response: str,
    ground_truth: Any,
    extra_info: Mapping | None = None,
    *,
    method: str = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
    **_: Any,
) -> dict:
    """`score` if the extracted number equals the ground truth, `format_score` if one was found but is wrong."""
    want = _ground_truth_number(ground_truth)
    if want is None:
        raise UserError(f"gsm8k scorer: ground truth {ground_truth!r} is not a number")
    pred = extract_answer(response, method)
    got = to_number(pred) if pred is not None else None
    correct = got is not None and got == want
    value = score if correct else (format_score if got is not None else 0.0)
    return {"score": float(value), "acc": float(correct), "pred": pred}
