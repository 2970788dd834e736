"""FSDP2 CPU offload (`param_offload`): the optimizer state stays with the parameters on the host (issue 49, defect 4).

With `param_offload` FSDP2 keeps the parameters and their gradients on the host and the optimizer steps there; with
`optimizer_offload` too, `load_optimizer` used to move the state to the GPU before each update, so the second step
met CPU parameters with CUDA state. CPU stand-in: a model whose device is declared CUDA (the one thing mocked; no
tensor ever goes there) with offloaded parameters: moving the state would fail here ("Torch not compiled with CUDA").
"""

from __future__ import annotations

import pytest
import torch

from rlkit.config.schema import FSDPConfig, OptimConfig
from rlkit.testing import save_tiny_model
from rlkit.workers.fsdp_model import FSDPModel
from tests.workers.test_cpu_bf16 import _batch


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("offload") / "tiny", tie_embeddings=True)


def _step(model: FSDPModel) -> float:
    ids, mask, pos, response = _batch()
    out = model.forward(ids, mask, pos, response)
    (-out.log_probs.mean()).backward()
    return model.clip_and_step(1.0)


def test_offloaded_parameters_keep_the_optimizer_state_on_the_host(tiny):
    model = FSDPModel(str(tiny), FSDPConfig(param_dtype="float32"), torch.device("cpu"))
    model.setup_optimizer(OptimConfig(lr=1e-2), total_steps=2)
    model.module.train()
    before = {k: v.clone() for k, v in model.iter_full_params()}
    assert torch.isfinite(torch.tensor(_step(model)))
    model.device, model.params_offloaded = torch.device("cuda", 0), True  # as FSDP2's CPUOffloadPolicy on a GPU
    for _ in range(2):  # the update loop's order with optimizer_offload: load, step, offload
        model.load_optimizer()
        states = [v for s in model.optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
        assert states and {t.device.type for t in states} == {"cpu"}
        model.device = torch.device("cpu")  # the step itself runs here on the host, as FSDP2 offload steps it
        assert torch.isfinite(torch.tensor(_step(model)))
        model.device = torch.device("cuda", 0)
        model.offload_optimizer()
    after = dict(model.iter_full_params())
    assert any(not torch.equal(before[k], after[k]) for k in before)
