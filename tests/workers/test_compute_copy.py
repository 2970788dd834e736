"""One bf16 worker without FSDP2 (rlkit/workers/compute_copy.py) computes what FSDP2's mixed precision computes.

The same tiny model (tied embeddings: one copy serves two slots), dithered fp32 masters, two micro-batches of
gradient accumulation, two AdamW steps: the plain module with its compute copy against FSDP2 on a 1-rank gloo
group (`shard_single_worker`), compared to the bit. The compute copy is what a single bf16 worker now runs."""

from __future__ import annotations

import pytest
import torch

from rlkit.config.schema import FSDPConfig, OptimConfig
from rlkit.testing import save_tiny_model
from rlkit.workers.fsdp_model import FSDPModel
from tests.workers.test_cpu_bf16 import _batch


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("copy") / "tiny", tie_embeddings=True)


def _train(tiny, shard: bool, steps: int = 2):
    """Per step: two micro-batches forward + backward, then an optimizer step; the log-probs of every forward,
    the masters' gradients before each step and the masters after the last."""
    torch.manual_seed(0)
    model = FSDPModel(str(tiny), FSDPConfig(param_dtype="bfloat16", shard_single_worker=shard), torch.device("cpu"))
    model.setup_optimizer(OptimConfig(lr=1e-2), total_steps=steps)
    model.module.train()
    ids, mask, pos, response = _batch()
    log_probs, grads = [], []
    for _ in range(steps):
        for rows in (slice(0, 2), slice(2, 4)):
            out = model.forward(ids[rows], mask[rows], pos[rows], response, with_entropy=True)
            (-out.log_probs.mean() - 0.01 * out.entropy.mean()).backward()
            log_probs.append(out.log_probs.detach())
        grads.append({n: p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad.clone()
                      for n, p in model.module.named_parameters()})
        model.clip_and_step(1e9)
    return model, log_probs, grads, dict(model.iter_full_params())


def test_compute_copy_matches_fsdp2_to_the_bit(tiny, process_group):
    fsdp, fsdp_lp, fsdp_grads, fsdp_params = _train(tiny, shard=True)
    plain, plain_lp, plain_grads, plain_params = _train(tiny, shard=False)
    assert fsdp.sharded and fsdp.compute_copy is None
    assert not plain.sharded and plain.compute_copy is not None
    for got, want in zip(plain_lp, fsdp_lp, strict=True):
        torch.testing.assert_close(got, want, atol=0, rtol=0)
    for got, want in zip(plain_grads, fsdp_grads, strict=True):
        assert got.keys() == want.keys()
        for name in want:
            assert got[name].dtype == torch.float32, name  # accumulated in the masters' dtype
            torch.testing.assert_close(got[name], want[name], atol=0, rtol=0, msg=name)
    assert plain_params.keys() == fsdp_params.keys()
    for name, want in fsdp_params.items():
        assert plain_params[name].dtype == torch.float32, name  # what checkpoints and the engine get
        torch.testing.assert_close(plain_params[name], want, atol=0, rtol=0, msg=name)
    states = [v for s in plain.optimizer.state.values() for v in s.values() if v.dim() > 0]
    assert states and {v.dtype for v in states} == {torch.float32}


def test_copies_follow_the_masters_and_a_frozen_model_keeps_only_its_copy(tiny, process_group):
    torch.manual_seed(0)
    ids, mask, pos, response = _batch()
    frozen = FSDPModel(str(tiny), FSDPConfig(param_dtype="bfloat16", dither_master_weights=False), torch.device("cpu"))
    for p in frozen.module.parameters():
        p.requires_grad_(False)
    with torch.no_grad():
        first = frozen.forward(ids, mask, pos, response).log_probs
        # a reference: nothing trains it, so after its first forward it holds bf16 weights alone
        assert {p.dtype for p in frozen.module.parameters()} == {torch.bfloat16}
        torch.testing.assert_close(frozen.forward(ids, mask, pos, response).log_probs, first, atol=0, rtol=0)

    model = FSDPModel(str(tiny), FSDPConfig(param_dtype="bfloat16", dither_master_weights=False), torch.device("cpu"))
    model.setup_optimizer(OptimConfig(lr=1e-2), total_steps=1)
    with torch.no_grad():
        torch.testing.assert_close(model.forward(ids, mask, pos, response).log_probs, first, atol=0, rtol=0)
        # a master changed in place (a checkpoint load does this) is cast again at the next forward
        for p in model.module.parameters():
            p.mul_(0.5)
        halved = model.forward(ids, mask, pos, response).log_probs
        assert not torch.equal(halved, first)
        assert {p.dtype for p in model.module.parameters()} == {torch.float32}  # the masters are back in place
