"""`toy_copy` scorer for the synthetic copy task (data_source `rlkit/toy_copy`).

Position-wise digit accuracy, divided by the longer of the two digit sequences,
so trailing extra digits cost as much as missing ones and only an exact copy
scores 1.0. Non-digit junk is ignored; the partial credit gives a dense signal
that a tiny model can learn from in a few steps.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from rlkit.reward.registry import SCORERS

_DIGIT = re.compile(r"\d")


@SCORERS.register("toy_copy")
def toy_copy_score(response: str, ground_truth: Any, extra_info: Mapping | None = None, **_: Any) -> dict:
    want = _DIGIT.findall(str(ground_truth))
    got = _DIGIT.findall(response)
    denom = max(len(want), len(got))
    hits = sum(a == b for a, b in zip(got, want))
    return {"score": hits / denom if denom else 0.0, "exact": float(got == want and bool(want))}
