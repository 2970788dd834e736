"""Validation generations (verl's `trainer.log_val_generations`, `validation_data_dir`) from a scored validation
batch: N rows per validation reach the file tracker, every sample reaches the dump folder."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from rlkit.protocol import Batch
from rlkit.testing import build_tiny_tokenizer
from rlkit.trainer.step.generations import dump, generations, pick
from rlkit.trainer.step.rl_trainer import RLTrainer
from rlkit.utils.tracking import Tracking


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()


def scored_batch(tok, n: int = 6, P: int = 4, R: int = 3) -> Batch:
    """n samples: prompt "i i" left-padded, response "i" + pad, score i / 10 on its last token."""
    prompts = torch.full((n, P), tok.pad_token_id)
    responses = torch.full((n, R), tok.pad_token_id)
    mask = torch.zeros((n, R), dtype=torch.long)
    scores = torch.zeros((n, R))
    for i in range(n):
        prompts[i, -2:] = torch.tensor(tok(f"{i} {i}", add_special_tokens=False)["input_ids"])
        responses[i, 0] = tok(str(i), add_special_tokens=False)["input_ids"][0]
        mask[i, 0] = 1
        scores[i, 0] = i / 10
    return Batch({"prompts": prompts, "responses": responses, "response_mask": mask, "token_level_scores": scores},
                 {"data_source": ["toy"] * n, "reward_model": [{"ground_truth": str(i)} for i in range(n)],
                  "reward_extra/acc": [float(i % 2) for i in range(n)]})


def test_rows_carry_verls_fields(tok):
    rows = generations(scored_batch(tok), tok, step=5)
    assert rows[2] == {"input": "2 2", "output": "2", "gts": "2", "score": pytest.approx(0.2), "step": 5, "acc": 0.0}


def test_pick_is_verls_choice(tok):
    rows = generations(scored_batch(tok), tok, step=0)
    expected = sorted(rows, key=lambda r: r["input"])
    np.random.RandomState(42).shuffle(expected)  # verl: sort by input, shuffle with seed 42, take N
    assert pick(rows, 3) == expected[:3]
    assert pick(rows, 0) == []


def test_each_validation_logs_n_rows_and_dumps_all(tmp_path, tok):
    """RLTrainer's own method, on a stand-in trainer holding the config values it reads and a file tracker."""
    trainer = SimpleNamespace(
        cfg=SimpleNamespace(trainer=SimpleNamespace(log_val_generations=2, validation_data_dir=str(tmp_path / "val"))),
        tokenizer=tok, global_step=0)
    with Tracking("file", log_dir=tmp_path / "logs") as tracker:
        trainer.tracker = tracker
        for step in (0, 3):
            trainer.global_step = step
            RLTrainer._record_val_generations(trainer, scored_batch(tok))
    rows = [json.loads(x) for x in (tmp_path / "logs" / "val_generations.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 0, 3, 3]  # N = 2 rows per validation, the same samples each time
    assert [r["input"] for r in rows[:2]] == [r["input"] for r in rows[2:]]
    assert set(rows[0]) == {"step", "input", "output", "score"}
    dumped = [json.loads(x) for x in (tmp_path / "val" / "3.jsonl").read_text().splitlines()]
    assert len(dumped) == 6 and dumped[4]["output"] == "4" and dumped[4]["step"] == 3
    assert sorted(p.name for p in (tmp_path / "val").iterdir()) == ["0.jsonl", "3.jsonl"]


def test_dump_replaces_a_replayed_step(tmp_path, tok):
    rows = generations(scored_batch(tok, n=2), tok, step=1)
    dump(rows, str(tmp_path), 1)
    dump(rows[:1], str(tmp_path), 1)
    assert len((tmp_path / "1.jsonl").read_text().splitlines()) == 1
