"""A GRPO run with Ulysses SP=2 (two workers, one SP group) learns the toy copy task.

Same task, model and thresholds as tests/trainer/test_learning.py (random tiny model with tied
embeddings; a random policy scores ~0.05): the actor's packed rows are split over the 2 workers of the
group, attention heads exchanged by all-to-all, every step. Slow: two workers on shared cores.
"""

from __future__ import annotations

import statistics

import pytest

from tests.trainer.conftest import fit, learning_overrides, tiny_model, toy_data, train_rows  # noqa: F401

STEPS = 100


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_grpo_with_sp2_learns_the_copy_task(toy_data, tiny_model, tmp_path):  # noqa: F811
    overrides = learning_overrides(
        toy_data,
        tiny_model,
        tmp_path,
        STEPS,
        trainer__n_gpus_per_node=2,
        actor_rollout_ref__actor__ulysses_sequence_parallel_size=2,
    )
    summary, rows, _ = fit("grpo", overrides, tmp_path / "logs")
    scores = [r["critic/score/mean"] for r in train_rows(rows)]
    assert len(scores) == STEPS
    first, last = statistics.fmean(scores[:10]), statistics.fmean(scores[-20:])
    print(
        f"GRPO SP=2: train reward first 10 {first:.3f} -> last 20 {last:.3f}; "
        f"median step {statistics.median(summary.step_seconds):.2f}s"
    )
    assert first < 0.2
    assert last > 0.5
