"""`math` scorer: the response's final `\\boxed{}` answer, compared with the ground
truth by symbolic equivalence (math-verify: fractions, radicals, intervals, sets...).

math-verify guards parse/verify with `signal.alarm`, which only works on the main
thread. The reward manager scores in worker threads, so there we switch its
timeout off and rely on the manager's per-sample timeout instead.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Mapping
from typing import Any

from rlkit.reward.registry import SCORERS

_BOXED = ("\\boxed", "\\fbox")


class _DropTimeoutDisabledWarning(logging.Filter):
    """math-verify warns once when its timeout is off; off-main-thread that is intended."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_DropTimeoutDisabledWarning())


def last_boxed(text: str) -> str | None:
    """The text from the last `\\boxed`/`\\fbox` on (math-verify parses the braces), or None."""
    idx = max(text.rfind(b) for b in _BOXED)
    return text[idx:] if idx >= 0 else None


def _gold_text(ground_truth: Any) -> str:
    text = str(ground_truth).strip()
    if any(b in text for b in _BOXED) or text.startswith("$"):
        return text
    return f"${text}$"


@SCORERS.register("math")
def math_score(
    response: str,
    ground_truth: Any,
    extra_info: Mapping | None = None,
    *,
    timeout_s: float = 5,
    format_score: float = 0.0,
    score: float = 1.0,
    **_: Any,
) -> dict:
    """`score` when the last boxed answer is equivalent to the ground truth, else `format_score`/0."""
    from math_verify import LatexExtractionConfig, parse, verify

    on_main = threading.current_thread() is threading.main_thread()
    timeout = max(1, math.ceil(timeout_s)) if on_main else None  # signal.alarm takes whole seconds
    boxed = last_boxed(response)
    if boxed is None:
        return {"score": 0.0, "acc": 0.0, "has_answer": 0.0}
    gold = parse(_gold_text(ground_truth), parsing_timeout=timeout)
    pred = parse(boxed, extraction_config=[LatexExtractionConfig(boxed_match_priority=0)], parsing_timeout=timeout)
    if not gold:
        raise ValueError(f"math scorer: cannot parse the ground truth {ground_truth!r}")
    correct = bool(pred) and verify(gold, pred, timeout_seconds=timeout)
    return {"score": float(score if correct else format_score), "acc": float(correct), "has_answer": 1.0}
