"""bf16 compute on CPU (`param_dtype: bfloat16`, what `auto` picks where bf16 matmul is faster): one actor
forward+backward agrees with fp32 and training keeps fp32 master weights and optimizer state."""

from __future__ import annotations

import logging

import pytest
import torch

from rlkit.config.schema import FSDPConfig, OptimConfig
from rlkit.testing import save_tiny_model
from rlkit.utils import cpu_precision

#: bf16 has 8 mantissa bits (relative rounding 2^-9 ~ 0.2%); through 2 layers, the loss and the gradient
#: norm of the tiny model agreed with fp32 to 7e-6 and 6e-4 (measured); 1e-2 leaves room for other seeds.
REL_TOL = 1e-2


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("bf16") / "tiny", tie_embeddings=True)


def _batch(rows: int = 4, length: int = 24, response: int = 8):
    ids = torch.randint(3, 60, (rows, length), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :5] = 0  # a left-padded prompt
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    return ids, mask, pos, response


def _loss_and_grad_norm(tiny, dtype: str):
    from rlkit.workers.fsdp_model import FSDPModel

    torch.manual_seed(0)
    model = FSDPModel(str(tiny), FSDPConfig(param_dtype=dtype), torch.device("cpu"))
    model.setup_optimizer(OptimConfig(lr=1e-2), total_steps=2)
    model.module.train()
    out = model.forward(*_batch(), with_entropy=True)
    assert out.log_probs.dtype == torch.float32  # the head's log-probs are fp32 either way
    loss = -out.log_probs.mean() - 0.01 * out.entropy.mean()
    loss.backward()
    norm = model.clip_and_step(1e9)  # no clipping: the norm itself, then one optimizer step
    return model, float(loss.detach()), norm


def test_bf16_forward_backward_agrees_with_fp32_and_keeps_fp32_master_weights(tiny, process_group):
    _, loss32, norm32 = _loss_and_grad_norm(tiny, "float32")
    model, loss16, norm16 = _loss_and_grad_norm(tiny, "bfloat16")
    print(f"loss fp32 {loss32:.6f} bf16 {loss16:.6f}; grad norm fp32 {norm32:.6f} bf16 {norm16:.6f}")
    assert loss16 == pytest.approx(loss32, rel=REL_TOL)
    assert norm16 == pytest.approx(norm32, rel=REL_TOL)
    assert loss16 != loss32  # it did compute in bf16 (fp32 would agree to the last bit)
    assert model.compute_copy is not None and model.param_dtype == torch.bfloat16  # one worker: cast once per step
    assert {p.dtype for p in model.module.parameters()} == {torch.float32}  # master weights
    states = [v for s in model.optimizer.state.values() for v in s.values() if v.dim() > 0]
    assert states and {v.dtype for v in states} == {torch.float32}  # Adam moments
    assert {t.dtype for _, t in model.iter_full_params()} == {torch.float32}  # what the engine and checkpoints get


@pytest.mark.parametrize("forced", ["bfloat16", "float32"])
def test_auto_on_cpu_follows_the_precision_choice(forced, monkeypatch, caplog):
    from rlkit.workers.fsdp_model import resolve_dtype

    monkeypatch.setenv(cpu_precision.OVERRIDE_ENV, forced)
    cpu_precision.auto_cpu_dtype.cache_clear()
    try:
        with caplog.at_level(logging.INFO, logger=cpu_precision.__name__):
            assert resolve_dtype("auto", torch.device("cpu")) == getattr(torch, forced)
            assert resolve_dtype("auto", torch.device("cpu")) == getattr(torch, forced)
        lines = [r for r in caplog.records if "CPU compute dtype" in r.getMessage()]
        assert len(lines) == 1  # once per process
        assert lines[0].levelno == logging.INFO  # the resource plan shows it; workers and the driver do not repeat it
        assert resolve_dtype("float32", torch.device("cpu")) == torch.float32  # explicit values are kept
    finally:
        cpu_precision.auto_cpu_dtype.cache_clear()


def _linear_rows(model, batches, bucket: int):
    """The row counts every Linear saw over `batches` (packed forwards), and the log-probs."""
    seen, outs = set(), []
    def rows(_module, args):
        seen.add(args[0].reshape(-1, args[0].shape[-1]).shape[0])

    hooks = [m.register_forward_pre_hook(rows) for m in model.module.modules() if isinstance(m, torch.nn.Linear)]
    model.token_bucket = bucket
    try:
        with torch.no_grad():
            outs = [model.forward(*b).log_probs for b in batches]
    finally:
        for h in hooks:
            h.remove()
    return seen, outs


def test_bf16_on_cpu_pads_token_counts_to_few_matmul_shapes(tiny, process_group):
    """oneDNN keeps a JIT kernel per bf16 matmul shape (rlkit/workers/shape_buckets.py): the packed row and the LM
    head's rows are padded to a multiple of 64, so 12 micro-batches of different lengths make at most 2 row counts,
    not 12 or more; the values are those of the unpadded forward (the padding is its own segment, the repeated head
    rows dropped)."""
    from rlkit.workers.fsdp_model import FSDPModel
    from rlkit.workers.shape_buckets import CPU_LOW_PRECISION_BUCKET, token_bucket

    assert token_bucket("cpu", torch.bfloat16) == CPU_LOW_PRECISION_BUCKET == 64
    assert token_bucket("cpu", torch.float32) == 1 and token_bucket("cuda", torch.bfloat16) == 1
    model = FSDPModel(str(tiny), FSDPConfig(param_dtype="bfloat16"), torch.device("cpu"))
    assert model.token_bucket == 64
    batches = []
    for i in range(12):  # 4 rows, lengths 20..31 with a different left padding each: 12 token counts
        ids, mask, pos, response = _batch(length=20 + i)
        mask[2, : i % 5] = 0
        batches.append((ids, mask, (mask.cumsum(1) - 1).clamp(min=0), response))
    bucketed, outs = _linear_rows(model, batches, 64)
    plain, ref = _linear_rows(model, batches, 1)
    assert len(plain) >= 12 and bucketed <= {64, 128}, (sorted(plain), sorted(bucketed))
    for a, b in zip(outs, ref):
        assert torch.allclose(a, b, atol=0.05), (a - b).abs().max()
