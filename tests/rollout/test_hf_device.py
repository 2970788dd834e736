"""The hf engine generates on the device its worker was given (issue 49, defect 5: it used to stay on the CPU
on a GPU node, 10-100x slower, also as the fallback and the MoE router-replay path)."""

from __future__ import annotations

import torch

from rlkit.rollout import RolloutConfig
from rlkit.workers.rollout_worker import RolloutWorker


def test_rollout_worker_places_the_hf_engine_on_its_device(model_path, prompts):
    worker = RolloutWorker(RolloutConfig(name="hf", prompt_length=32, response_length=4, sleep_level=1),
                           str(model_path))
    # the CPU's device 0: a device no default produces (HFRollout alone would pick plain "cpu"), so the engine's
    # device can only be this one if the worker passed it
    worker.device = torch.device("cpu", 0)
    worker.init_model()
    engine = worker.engine
    assert engine.device == worker.device
    assert {p.device.type for p in engine.model.parameters()} == {"cpu"}
    out = worker.generate_sequences(prompts, greedy=True)
    assert out["responses"].shape == (len(prompts), 4)
