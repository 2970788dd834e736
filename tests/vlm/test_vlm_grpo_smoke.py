"""Two GRPO steps on the shapes task with the tiny Qwen2.5-VL through the whole trainer (Ray workers, HF
rollout with the images, old log-probs, update, weight sync): the steps run, every sample is scored, and the
update reaches the vision tower (its weights move) while the engine sees the images (its log-probs are the
trainer's)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from data_prep.shapes import command as shapes
from rlkit.testing import save_tiny_vlm
from tests.trainer.conftest import fit, toy_overrides, train_rows

STEPS = 2


@pytest.mark.timeout(600)
def test_grpo_on_images_runs_and_trains_the_vision_tower(tmp_path):
    shapes(out=tmp_path / "shapes", questions="colour", train_size=32, test_size=4)
    model = save_tiny_vlm(tmp_path / "vlm")
    overrides = toy_overrides(
        tmp_path / "shapes", model, tmp_path / "run",
        data__max_response_length=1, data__train_batch_size=4, actor_rollout_ref__rollout__n=4,
        actor_rollout_ref__actor__ppo_mini_batch_size=4, trainer__total_training_steps=STEPS,
        actor_rollout_ref__rollout__calculate_log_probs="true", actor_rollout_ref__actor__recompute_old_log_prob="true",
    )
    summary, rows, state = fit("grpo", overrides, tmp_path / "run" / "logs", keep_state=True)
    steps = train_rows(rows)
    assert summary.steps == STEPS == len(steps)
    assert all(0.0 <= r["critic/score/mean"] <= 1.0 and r["response_length/mean"] == 1.0 for r in steps)
    before = load_file(str(model / "model.safetensors"))
    moved = [n for n, t in state.items() if n.startswith("model.visual.")
             and not torch.equal(t, before[n.replace("model.visual.", "visual.")])]
    assert moved, "the update did not reach the vision tower"
    # the engine generated from the images: its log-probs are the trainer's but for the never-sampled image pads'
    # mass (measured 0.018 a token); an engine without the images was 0.12-0.22 away
    gaps = [r["rollout/log_prob_abs_diff"] for r in steps]
    assert max(gaps) < 0.05, gaps
