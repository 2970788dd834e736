"""Validation (`val/<source>/...`) and `rlkit eval` compute mean@k / best@k / pass@k / maj@k with one module
(rlkit.algo.sample_metrics): the same scored generations give the same numbers through both paths."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlkit.algo.sample_metrics import group_metrics, majority_correct
from rlkit.eval.evaluator import _rows, aggregate
from rlkit.protocol import Batch
from rlkit.reward.manager import RewardManager
from rlkit.testing import build_tiny_tokenizer
from rlkit.trainer.step.step_metrics import validation_metrics

K = 3
# (data_source, ground truth, k responses); the gsm8k scorer extracts "#### N" (strict), toy_copy scores digits
PROMPTS = [
    ("openai/gsm8k", "5", ["#### 5", "#### 7", "#### 7"]),  # majority 7 is wrong; one sample right
    ("openai/gsm8k", "3", ["answer", "the", "#### 3"]),  # two responses without an answer: not votes
    ("openai/gsm8k", "2", ["answer 2", "copy", "the digits"]),  # no extracted answer at all: maj counts 0
    ("rlkit/toy_copy", "7", ["7", "7", "3"]),
    ("rlkit/toy_copy", "4 2", ["4 2", "4", "1"]),  # partial credit: only a full score is correct
]


def generations(tok) -> Batch:
    """K responses per prompt, right-padded like a rollout's, with the non-tensor columns both paths read."""
    texts, rows = [], []
    for p, (ds, gt, responses) in enumerate(PROMPTS):
        for text in responses:
            texts.append(text)
            rows.append((p, ds, gt))
    ids = [tok(t)["input_ids"] for t in texts]
    width = max(len(i) for i in ids) + 1
    responses = torch.full((len(ids), width), tok.pad_token_id)
    mask = torch.zeros((len(ids), width), dtype=torch.long)
    for i, row in enumerate(ids):
        responses[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
    col = lambda values: np.array(values, dtype=object)  # noqa: E731
    return Batch({"responses": responses, "response_mask": mask}, {
        "data_source": col([ds for _, ds, _ in rows]),
        "reward_model": col([{"style": "rule", "ground_truth": gt} for _, _, gt in rows]),
        "uid": col([f"uid-{p}" for p, _, _ in rows]),  # validation groups by uid
        "prompt_index": col([p for p, _, _ in rows]),  # rlkit eval by prompt index
    })


def test_validation_and_eval_agree_on_the_same_generations():
    tok = build_tiny_tokenizer()
    out = generations(tok)
    scored = RewardManager(tok, num_workers=1)(out)

    val_batch = generations(tok)
    val_batch.union(scored)
    val = validation_metrics(val_batch, K)
    ev = aggregate(_rows(out, scored, tok), K)

    assert set(ev) == {"openai/gsm8k", "rlkit/toy_copy"}
    for ds, metrics in ev.items():
        shared = {k: v for k, v in metrics.items() if k != "prompts"}
        from_val = {k.removeprefix(f"val/{ds}/"): v for k, v in val.items() if k.startswith(f"val/{ds}/")}
        assert from_val == pytest.approx(shared), ds

    g = ev["openai/gsm8k"]  # by hand: correct = [1,0,0], [0,0,1], [0,0,0]
    assert g["acc/mean@3"] == pytest.approx(2 / 9) and g["score/mean@3"] == pytest.approx(2 / 9)
    assert g["acc/pass@3"] == pytest.approx(2 / 3) and g["score/best@3"] == pytest.approx(2 / 3)
    # majority: "7" (wrong); "3" (right: the two answerless responses do not outvote it); no vote (wrong)
    assert g["acc/maj@3"] == pytest.approx(1 / 3)
    t = ev["rlkit/toy_copy"]  # scores [1,1,0] and [1,0.5,0]; correct = a full score
    assert t["score/mean@3"] == pytest.approx((2 / 3 + 1.5 / 3) / 2)
    assert t["acc/mean@3"] == pytest.approx((2 / 3 + 1 / 3) / 2) and t["acc/pass@3"] == 1.0
    assert "acc/maj@3" not in t  # the toy scorer extracts no answer
    assert t["prompts"] == 2.0


def test_majority_vote_rules():
    assert majority_correct(["7", "7", "5"], [False, False, True]) is False
    assert majority_correct([None, None, "3"], [False, False, True]) is True  # no answer is no vote
    assert majority_correct([None, None], [False, False]) is False
    assert majority_correct(["1", "2", "2", "1"], [True, False, False, True]) is True  # tie: first seen
    assert majority_correct([5, "5", None], [True, True, False]) is True  # answers compare as text


def test_k1_reports_means_only():
    m = group_metrics(["a", "b"], [1.0, 0.0], 1, acc=[None, None], preds=["1", None], lengths=[3, 5])
    assert m == {"score/mean@1": 0.5, "acc/mean@1": 0.5, "response_length/mean": 4.0, "response_length/max": 5.0}
