"""`shapes` scorer for the synthetic visual task (data_source `rlkit/shapes`, `rlkit data shapes`).

Exact match of the response's first word with the answer (a count, a colour or a side): one word answers, so a
model scores only when it read the image, and a text-only guess scores at chance (1 in the answer's options).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlkit.reward.registry import SCORERS


@SCORERS.register("shapes")
def shapes_score(response: str, ground_truth: Any, extra_info: Mapping | None = None, **_: Any) -> float:
    words = response.replace("<|im_end|>", " ").split()
    return float(bool(words) and words[0].lower() == str(ground_truth).strip().lower())
