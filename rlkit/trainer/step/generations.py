"""Generations as text, for people to read: verl's `trainer.log_val_generations` (N validation samples to every
tracker), `trainer.validation_data_dir` and `trainer.rollout_data_dir` (every sample of a validation / a
training step dumped to `<dir>/<step>.jsonl`).

A sample is its decoded prompt (`input`), decoded response up to its last valid token (`output`), its score
(the sum of `token_level_scores`), its ground truth (`gts`), the step, and the reward manager's per-sample
extras (`reward_extra/<name>` as `<name>`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from rlkit.protocol import Batch
from rlkit.reward.placement import decode_responses

log = logging.getLogger("rlkit.trainer")

EXTRA_PREFIX = "reward_extra/"
PICK_SEED = 42  # verl's: the same N validation samples every time


def generations(batch: Batch, tokenizer: Any, step: int) -> list[dict[str, Any]]:
    """One dict per sample: input, output, gts, score, step and the reward extras."""
    n = len(batch)
    inputs = tokenizer.batch_decode(batch["prompts"].tolist(), skip_special_tokens=True) if n else []
    outputs = decode_responses(tokenizer, batch["responses"], batch["response_mask"]) if n else []
    scores = batch["token_level_scores"].sum(-1).tolist()
    reward_model = batch["reward_model"] if "reward_model" in batch else [None] * n
    gts = [rm.get("ground_truth") if isinstance(rm, Mapping) else None for rm in reward_model]
    extras = {k[len(EXTRA_PREFIX):]: batch[k] for k in batch.keys() if k.startswith(EXTRA_PREFIX)}
    rows = []
    for i in range(n):
        row = {"input": inputs[i], "output": outputs[i], "gts": gts[i], "score": scores[i], "step": step}
        row.update({name: _plain(values[i]) for name, values in extras.items() if name not in row})
        rows.append(row)
    return rows


def pick(rows: list[dict[str, Any]], count: int) -> list[dict[str, Any]]:
    """verl's choice of the samples to log: sorted by input, shuffled with a fixed seed, the first `count`."""
    if count <= 0:
        return []
    chosen = sorted(rows, key=lambda r: r["input"])
    order = np.random.RandomState(PICK_SEED).permutation(len(chosen))
    return [chosen[i] for i in order[:count]]


def dump(rows: list[dict[str, Any]], folder: str, step: int) -> Path:
    """`<folder>/<step>.jsonl`, one sample per line (replaced if a resumed run writes the step again)."""
    path = Path(folder).expanduser() / f"{step}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False, default=str) + "\n" for r in rows), encoding="utf-8")
    log.info("dumped %d generations to %s", len(rows), path)
    return path


def _plain(value: Any) -> Any:
    """numpy scalars as Python numbers, so the dump is plain JSON."""
    return value.item() if isinstance(value, np.generic) else value
