import numpy as np
import pytest
import torch

from rlkit.algo.metrics import compute_data_metrics
from rlkit.protocol import Batch

T = torch.tensor


def make_batch(with_values: bool) -> Batch:
    tensors = {
        "attention_mask": T([[0, 1, 1, 1, 1], [1, 1, 1, 0, 0]]),  # P=2 prompt ++ R=3 response
        "response_mask": T([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]]),
        "token_level_scores": T([[0.0, 0.0, 1.0], [0.5, 0.0, 0.0]]),
        "token_level_rewards": T([[0.0, 0.0, 0.9], [0.4, 0.0, 0.0]]),
        "advantages": T([[1.0, 1.0, 1.0], [-2.0, 9.0, 9.0]]),  # masked 9s must not count
        "returns": T([[1.0, 2.0, 3.0], [4.0, -9.0, -9.0]]),
    }
    if with_values:
        tensors["values"] = T([[0.5, 0.5, 0.5], [1.5, 100.0, 100.0]])
    return Batch(tensors, {"uid": np.array(["a", "a"], dtype=object)})


def test_data_metrics_by_hand():
    m = compute_data_metrics(make_batch(with_values=True))
    expected = {
        "critic/score/mean": 0.75,
        "critic/score/max": 1.0,
        "critic/score/min": 0.5,
        "critic/rewards/mean": 0.65,
        "critic/rewards/max": 0.9,
        "critic/rewards/min": 0.4,
        "critic/advantages/mean": 0.25,
        "critic/advantages/max": 1.0,
        "critic/advantages/min": -2.0,
        "critic/returns/mean": 2.5,
        "critic/returns/max": 4.0,
        "critic/returns/min": 1.0,
        "critic/values/mean": 0.75,
        "critic/values/max": 1.5,
        "critic/values/min": 0.5,
        "response_length/mean": 2.0,
        "response_length/max": 3.0,
        "response_length/min": 1.0,
        "response_length/clip_ratio": 0.5,
        "prompt_length/mean": 1.5,
        "prompt_length/max": 2.0,
        "prompt_length/min": 1.0,
    }
    assert m == pytest.approx(expected)
    assert all(type(v) is float for v in m.values())


def test_data_metrics_optional_keys():
    m = compute_data_metrics(make_batch(with_values=False))
    assert not any(k.startswith("critic/values") for k in m)
    only_mask = Batch({"response_mask": T([[1.0, 1.0], [1.0, 0.0]])})
    m = compute_data_metrics(only_mask)
    assert m == pytest.approx(
        {
            "response_length/mean": 1.5,
            "response_length/max": 2.0,
            "response_length/min": 1.0,
            "response_length/clip_ratio": 0.5,
        }
    )


def test_accuracy_from_scorer_extras_train_and_validation():
    """A scorer's `acc` extra (correctness without the format bonus) becomes reward/acc/mean on train
    batches and val/<source>/acc/mean@n, pass@n on validation, computed by hand here."""
    from rlkit.trainer.step.step_metrics import validation_metrics

    batch = make_batch(with_values=False)
    batch.non_tensors["reward_extra/acc"] = np.array([1.0, 0.0], dtype=object)
    assert compute_data_metrics(batch)["reward/acc/mean"] == 0.5

    # 2 prompts x n=2: scores include a 0.2 format bonus that acc must not count
    val = Batch({"token_level_scores": T([[0.0, 1.0], [0.2, 0.0], [0.2, 0.0], [0.0, 0.0]]),
                 "response_mask": T([[1.0, 1.0]] * 4)},
                {"uid": np.array(["p", "p", "q", "q"], dtype=object),
                 "data_source": np.array(["openai/gsm8k"] * 4, dtype=object),
                 "reward_extra/acc": np.array([1.0, 0.0, 0.0, 0.0], dtype=object)})
    m = validation_metrics(val, n=2)
    assert m["val/openai/gsm8k/score/mean@2"] == pytest.approx(0.35)
    assert m["val/openai/gsm8k/acc/mean@2"] == pytest.approx(0.25)
    assert m["val/openai/gsm8k/acc/pass@2"] == pytest.approx(0.5)
