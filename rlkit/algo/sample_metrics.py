"""mean@k / best@k / pass@k / maj@k over k scored samples per prompt: one definition for validation
(`val/<data_source>/...`, rlkit.trainer.step.step_metrics) and `rlkit eval` (rlkit.eval.evaluator).

Per sample: its score, whether it is correct, its extracted answer (or None) and its length.
A sample is correct when the scorer's `acc` extra says so (correctness without format
bonuses); a scorer that reports no `acc` counts a full score (>= 1) as correct.

Per data source, every prompt (group) weighs the same:
* `score/mean@k`: mean score;  `score/best@k` (k > 1): the best score of the k;
* `acc/mean@k`: share of correct samples;  `acc/pass@k` (k > 1): some sample is correct;
* `acc/maj@k` (k > 1, when some sample of the source has an extracted answer, the scorer's
  `pred` extra): the most frequent extracted answer is correct. A response with no extracted
  answer is not a vote; a prompt with no vote at all counts as wrong; a tie goes to the answer
  seen first;
* `response_length/mean`, `response_length/max`: over samples.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np

FULL_SCORE = 1.0


def is_correct(score: float, acc: Any = None) -> bool:
    """`acc` when the scorer reported it for this sample, else a full score."""
    return bool(acc) if acc is not None else score >= FULL_SCORE


def majority_correct(preds: Sequence[Any], correct: Sequence[bool]) -> bool:
    """Whether the most frequent extracted answer (None is no vote; ties: first seen) is correct."""
    votes = Counter(str(p) for p in preds if p is not None)
    if not votes:
        return False
    top = votes.most_common(1)[0][0]
    return next(c for p, c in zip(preds, correct) if p is not None and str(p) == top)


def group_metrics(
    groups: Sequence[Hashable],
    scores: Sequence[float],
    k: int,
    acc: Sequence[Any] | None = None,
    preds: Sequence[Any] | None = None,
    lengths: Sequence[float] | None = None,
) -> dict[str, float]:
    """The metrics of one data source; row i belongs to prompt `groups[i]` (see the module docstring)."""
    n = len(scores)
    acc = list(acc) if acc is not None else [None] * n
    correct = [is_correct(float(s), a) for s, a in zip(scores, acc)]
    rows: dict[Hashable, list[int]] = defaultdict(list)
    for i, g in enumerate(groups):
        rows[g].append(i)
    members = list(rows.values())

    def per_group(fn: Any) -> float:
        return float(np.mean([fn(m) for m in members]))

    score = np.asarray(scores, dtype=float)
    ok = np.asarray(correct, dtype=float)
    out = {f"score/mean@{k}": per_group(lambda m: score[m].mean()), f"acc/mean@{k}": per_group(lambda m: ok[m].mean())}
    if k > 1:
        out[f"score/best@{k}"] = per_group(lambda m: score[m].max())
        out[f"acc/pass@{k}"] = per_group(lambda m: ok[m].max())
        if preds is not None and any(p is not None for p in preds):
            out[f"acc/maj@{k}"] = per_group(lambda m: float(majority_correct([preds[i] for i in m],
                                                                              [correct[i] for i in m])))
    if lengths is not None and n:
        out["response_length/mean"] = float(np.mean(lengths))
        out["response_length/max"] = float(np.max(lengths))
    return out


def metrics_by_source(
    data_sources: Sequence[str],
    groups: Sequence[Hashable],
    scores: Sequence[float],
    k: int,
    acc: Sequence[Any] | None = None,
    preds: Sequence[Any] | None = None,
    lengths: Sequence[float] | None = None,
) -> dict[str, dict[str, float]]:
    """data_source -> `group_metrics` of its rows (sources sorted)."""
    out = {}
    for ds in sorted(set(data_sources)):
        idx = [i for i, d in enumerate(data_sources) if d == ds]

        def pick(col: Sequence[Any] | None, idx: list[int] = idx) -> list[Any] | None:
            return None if col is None else [col[i] for i in idx]

        out[ds] = group_metrics(pick(groups), pick(scores), k, pick(acc), pick(preds), pick(lengths))  # type: ignore[arg-type]
    return out
