"""GRPO learns the toy copy task with bf16 compute forced (`param_dtype=bfloat16`, what `auto` picks on CPUs
whose bf16 matmul is faster: AMX, AVX512-BF16), so the mixed-precision path trains, not only agrees for
one step (tests/workers/test_cpu_bf16.py). Same settings and thresholds as tests/trainer/test_learning.py's
GRPO run (fp32 master weights, fp32 Adam state; the hf engine samples in fp32).
"""

from __future__ import annotations

import pytest

from tests.trainer.conftest import fit, learning_curve, learning_overrides

STEPS = 100


@pytest.mark.slow
@pytest.mark.timeout(1800)  # see the measured time in the print; far more when the machine is shared
def test_grpo_learns_the_copy_task_in_bf16(toy_data, tiny_model, tmp_path):
    overrides = learning_overrides(
        toy_data, tiny_model, tmp_path, STEPS, actor_rollout_ref__actor__fsdp_config__param_dtype="bfloat16"
    )
    summary, rows, _ = fit("grpo", overrides, tmp_path / "logs")
    first, last, val_key = learning_curve(summary, rows, STEPS, "bf16 GRPO")
    assert first < 0.2
    assert last > 0.5
    assert summary.last_val[val_key] > 0.6
