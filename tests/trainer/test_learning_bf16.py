"""GRPO learns the toy copy task with bf16 compute forced (`param_dtype=bfloat16`, what `auto` picks on CPUs
whose bf16 matmul is faster: AMX, AVX512-BF16), so the mixed-precision path trains, not only agrees for
one step (tests/workers/test_cpu_bf16.py). Same settings and thresholds as tests/trainer/test_learning.py's
GRPO run (fp32 master weights, fp32 Adam state; the hf engine samples in fp32).
"""

from __future__ import annotations

import statistics

import pytest

from tests.trainer.conftest import fit, learning_overrides, train_rows

STEPS = 100


@pytest.mark.slow
@pytest.mark.timeout(1800)  # see the measured time in the print; far more when the machine is shared
def test_grpo_learns_the_copy_task_in_bf16(toy_data, tiny_model, tmp_path):
    overrides = learning_overrides(
        toy_data, tiny_model, tmp_path, STEPS, actor_rollout_ref__actor__fsdp_config__param_dtype="bfloat16"
    )
    summary, rows, _ = fit("grpo", overrides, tmp_path / "logs")
    scores = [r["critic/score/mean"] for r in train_rows(rows)]
    assert len(scores) == STEPS == summary.steps
    first, last = statistics.fmean(scores[:10]), statistics.fmean(scores[-20:])
    val_key = "val/rlkit/toy_copy/score/mean@1"
    print(
        f"bf16 GRPO train reward first 10 {first:.3f} -> last 20 {last:.3f}; greedy val "
        f"{summary.first_val[val_key]:.3f} -> {summary.last_val[val_key]:.3f}; "
        f"median step {statistics.median(summary.step_seconds):.2f}s"
    )
    assert first < 0.2
    assert last > 0.5
    assert summary.last_val[val_key] > 0.6
