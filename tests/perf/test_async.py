"""One-step-off-policy mode (`trainer.one_step_off_policy`) learns the toy copy task.

A separate rollout worker generates batch k+1 while the actor trains on batch k; the update
corrects with truncated importance sampling on the rollout's log-probs. Same task, model and
seeds as tests/trainer/test_learning.py (GRPO, hf rollout, n=8, 32 prompts/step, lr 5e-3), where the
synchronous trainer reaches a last-20 train reward > 0.5 by step 100. Here 70 steps (a 120-step run
reached 0.997 and greedy validation 1.0); bench/async_curve.py shows sync and async curves side by side.
"""

from __future__ import annotations

import statistics

import pytest

from rlkit.trainer.one_step_off import OneStepOffRollout
from rlkit.trainer.run_config import load_config
from tests.trainer.conftest import fit, toy_overrides, train_rows

STEPS = 70


@pytest.mark.slow
@pytest.mark.timeout(1800)  # ~1-2 min on idle cores; far more when the machine is shared
def test_one_step_off_policy_learns_the_copy_task(toy_data, tiny_model, tmp_path, ray_local):
    overrides = toy_overrides(
        toy_data, tiny_model, tmp_path,
        data__val_files=toy_data / "test.parquet", data__train_batch_size=32,
        actor_rollout_ref__actor__ppo_mini_batch_size=32, trainer__total_training_steps=STEPS,
        trainer__val_before_train=True, trainer__save_freq=-1, trainer__one_step_off_policy=True,
        trainer__rollout_cpus_per_worker=1,
    )
    cfg = load_config("grpo", overrides)  # what the run is built from (finalized)
    summary, rows, _ = fit("grpo", overrides, tmp_path / "logs", expect=OneStepOffRollout)
    rows = train_rows(rows)
    scores = [r["critic/score/mean"] for r in rows]
    first, last = statistics.fmean(scores[:10]), statistics.fmean(scores[-20:])
    val_key = "val/rlkit/toy_copy/score/mean@1"
    print(f"one-step-off GRPO: train reward first 10 {first:.3f} -> last 20 {last:.3f}; greedy val "
          f"{summary.first_val[val_key]:.3f} -> {summary.last_val[val_key]:.3f}; "
          f"median step {statistics.median(summary.step_seconds):.2f}s")
    assert len(scores) == STEPS
    assert first < 0.2 and last > 0.5
    assert summary.last_val[val_key] > 0.6
    # the mode did what it says: batches after the first were generated one update behind, while training
    assert rows[0]["rollout/staleness"] == 0 and all(r["rollout/staleness"] == 1 for r in rows[1:])
    assert cfg.algorithm.rollout_is and cfg.actor_rollout_ref.rollout.calculate_log_probs
    assert all("timing_s/rollout_load_weights" in r for r in rows[1:])
    assert statistics.median(r["timing_s/gen_overlapped"] for r in rows[1:]) > 0
    # the actor's peaks every step; the rollout group's only once it is idle (the last step), never by waiting
    assert all("memory/update_actor/rss_peak_gb" in r for r in rows)
    assert "memory/generate_sequences/rss_peak_gb" in rows[-1]
    assert not any("memory/generate_sequences/rss_peak_gb" in r for r in rows[1:-1])
