"""RewardManager on a hand-built rollout Batch with the tiny tokenizer."""

from __future__ import annotations

import logging
import time

import pytest
import torch

from rlkit.errors import UserError
from rlkit.protocol import Batch
from rlkit.reward import SCORERS, RewardManager
from rlkit.testing import build_tiny_tokenizer

if "test_raise" not in SCORERS:

    @SCORERS.register("test_raise")
    def _raise(response, ground_truth, extra_info, **_):
        raise RuntimeError("scorer exploded")

    @SCORERS.register("test_sleep")
    def _sleep(response, ground_truth, extra_info, **_):
        time.sleep(3)
        return 1.0


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()


def make_batch(tok, rows, R=8):
    """rows: (data_source, response text, ground truth[, mask override])."""
    responses = torch.full((len(rows), R), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), R), dtype=torch.long)
    for i, row in enumerate(rows):
        ids = tok(row[1], add_special_tokens=False)["input_ids"] if row[1] else []
        responses[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        mask[i, : len(ids)] = 1
        if len(row) > 3:
            mask[i] = torch.tensor(row[3])
    return Batch(
        {"responses": responses, "response_mask": mask},
        {
            "data_source": [r[0] for r in rows],
            "reward_model": [{"style": "rule", "ground_truth": r[2]} for r in rows],
            "extra_info": [{"index": i} for i in range(len(rows))],
        },
    )


def test_scores_land_on_the_last_valid_token(tok):
    batch = make_batch(
        tok,
        [
            ("rlkit/toy_copy", "4 1 7 <|im_end|>", "4 1 7"),
            ("rlkit/toy_copy", "4 1 <|im_end|>", "4 1 7"),
            ("rlkit/toy_copy", "4 1 7 copy 9 9", "4 1 7", [1, 1, 1, 0, 0, 1, 0, 0]),  # tool tokens masked out
            ("rlkit/toy_copy", "", "4 1 7"),
        ],
    )
    out = RewardManager(tok)(batch)
    scores = out["token_level_scores"]
    assert scores.dtype == torch.float32 and scores.shape == (4, 8)
    assert scores[0, 3] == 1.0 and scores[0].sum() == 1.0
    assert scores[1, 2] == pytest.approx(2 / 3) and scores[1].sum() == pytest.approx(2 / 3)
    assert scores[2, 5] == pytest.approx(3 / 5)  # decoded through the last valid token, tool tokens included
    assert scores[3].abs().sum() == 0.0
    assert list(out["reward_extra/exact"]) == [1.0, 0.0, 0.0, 0.0]
    metrics = out.meta["metrics"]
    assert metrics["reward/errors"] == [0.0]
    assert metrics["reward/rlkit/toy_copy/score/mean"][0] == pytest.approx((1 + 2 / 3 + 3 / 5) / 4)


def test_raising_and_slow_scorers_cost_one_sample_each(tok, caplog):
    batch = make_batch(
        tok,
        [
            ("rlkit/toy_copy", "4 1 7 <|im_end|>", "4 1 7"),
            ("boom", "4 <|im_end|>", "4"),
            ("boom", "5 <|im_end|>", "5"),
            ("slow", "4 <|im_end|>", "4"),
        ],
    )
    manager = RewardManager(tok, scorer_overrides={"boom": "test_raise", "slow": "test_sleep"}, timeout_s=0.5)
    start = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="rlkit.reward.manager"):
        out = manager.compute(batch)
    assert time.monotonic() - start < 2.0
    assert out["token_level_scores"].sum(-1).tolist() == [1.0, 0.0, 0.0, 0.0]
    metrics = out.meta["metrics"]
    assert metrics["reward/errors"] == [3.0] and metrics["reward/timeouts"] == [1.0]
    exploded = [r for r in caplog.records if "scorer exploded" in r.getMessage()]
    assert len(exploded) == 1 and "Traceback" in exploded[0].getMessage()  # logged once, with the traceback


def test_timeouts_do_not_stall_later_samples(tok):
    """Two workers, both stuck: the queued samples still run after the stuck ones are abandoned."""
    rows = [("slow", "4", "4")] * 2 + [("rlkit/toy_copy", "4 1 7", "4 1 7")] * 4
    manager = RewardManager(tok, scorer_overrides={"slow": "test_sleep"}, num_workers=2, timeout_s=0.3)
    start = time.monotonic()
    out = manager(make_batch(tok, rows))
    assert time.monotonic() - start < 2.0
    assert out["token_level_scores"].sum(-1).tolist() == [0.0, 0.0, 1.0, 1.0, 1.0, 1.0]


def test_custom_function_sync_and_async(tok, tmp_path):
    seen = []

    def mine(response, ground_truth, extra_info, data_source=None, bonus=0.0):
        seen.append((data_source, extra_info["index"]))
        return {"score": float(response.strip() == ground_truth) + bonus, "length": len(response)}

    batch = make_batch(tok, [("anything", "4 1", "4 1"), ("other", "7", "8")])
    out = RewardManager(tok, custom_fn=mine, scorer_kwargs={"custom": {"bonus": 0.5}})(batch)
    assert out["token_level_scores"].sum(-1).tolist() == [1.5, 0.5]
    assert list(out["reward_extra/length"]) == [3, 1]
    assert sorted(seen) == [("anything", 0), ("other", 1)]

    path = tmp_path / "my_reward.py"
    path.write_text(
        "import asyncio\n\nasync def compute_score(response, ground_truth, extra_info, **kw):\n"
        "    await asyncio.sleep(0.01)\n    return 0.25\n"
    )
    out = RewardManager(tok, custom_fn={"path": str(path), "name": "compute_score"})(batch)
    assert out["token_level_scores"].sum(-1).tolist() == [0.25, 0.25]


def test_bad_return_values_are_errors_not_crashes(tok):
    batch = make_batch(tok, [("x", "4", "4"), ("y", "4", "4"), ("z", "4", "4"), ("ok", "4", "4")])
    returns = {"x": "high", "y": {"acc": 1.0}, "z": float("nan"), "ok": 1.0}
    out = RewardManager(tok, custom_fn=lambda r, g, e, data_source: returns[data_source])(batch)
    assert out.meta["metrics"]["reward/errors"] == [3.0]  # one sample scored: the run goes on
    assert out["token_level_scores"].sum(-1).tolist() == [0.0, 0.0, 0.0, 1.0]


def test_unknown_data_source_is_a_user_error(tok):
    with pytest.raises(UserError, match="scorer_overrides"):
        RewardManager(tok)(make_batch(tok, [("who/knows", "4", "4")]))
    with pytest.raises(UserError, match="Did you mean 'gsm8k'"):
        RewardManager(tok, scorer_overrides={"who/knows": "gsm8"})(make_batch(tok, [("who/knows", "4", "4")]))


def test_text_level_entry_point():
    manager = RewardManager(scorer_kwargs={"gsm8k": {"method": "flexible"}})
    res = manager.score_texts(
        ["The answer is 1,000.", "\\boxed{\\frac{1}{2}}", "4 1 7"],
        ["1000", "0.5", "4 1 7"],
        ["openai/gsm8k", "HuggingFaceH4/MATH-500", "rlkit/toy_copy"],
    )
    assert [r.score for r in res] == [1.0, 1.0, 1.0]
    assert [r.scorer for r in res] == ["gsm8k", "math", "toy_copy"]
