"""bf16 compute from a bf16 checkpoint: dithered fp32 masters keep the loaded model's numerics exactly and let
small updates reach the forward (rlkit/workers/master_dither.py; bench/bf16_signal.py measures it on SmolLM2)."""

from __future__ import annotations

import pytest
import torch

from rlkit.config.schema import FSDPConfig, OptimConfig
from rlkit.testing import save_tiny_model
from rlkit.workers.master_dither import dither_masters, dither_tensor


def _grid_tensor(n: int = 200_000) -> torch.Tensor:
    """Weights as a bf16 checkpoint holds them, loaded into float32 masters (every value on the bf16 grid)."""
    x = torch.randn(n, generator=torch.Generator().manual_seed(0)) * 0.05
    x[:10] = 0.0
    return x.to(torch.bfloat16).float()


def test_dither_keeps_the_bf16_view_and_moves_every_nonzero_grid_value():
    master = _grid_tensor()
    view = master.to(torch.bfloat16)
    moved = dither_tensor(master, torch.bfloat16, torch.Generator().manual_seed(1))
    assert torch.equal(master.to(torch.bfloat16).view(torch.int16), view.view(torch.int16))  # bit for bit
    assert moved >= 0.9999 * (master.numel() - 10)  # a value whose cell fp32 cannot split may stay
    assert torch.all(master[:10] == 0)  # zeros stay: bf16 represents tiny values, no dead zone there
    assert int((master != view.float()).sum()) == moved


def test_off_grid_masters_are_left_alone():
    master = torch.randn(1000, generator=torch.Generator().manual_seed(0)) * 0.05  # an fp32 checkpoint
    before = master.clone()
    assert dither_tensor(master, torch.bfloat16, torch.Generator().manual_seed(1)) == 0
    assert torch.equal(master, before)
    assert dither_masters([torch.nn.Parameter(master)], torch.float32) == 0.0  # fp32 compute: nothing to do


@pytest.mark.parametrize("dither", [False, True])
def test_a_small_update_reaches_the_bf16_view_only_when_dithered(dither):
    """An update of 3e-5 (a tenth to a half of most weights' half grid step): on the grid the view never moves;
    dithered, its expected change equals the update."""
    master = _grid_tensor()
    if dither:
        dither_tensor(master, torch.bfloat16, torch.Generator().manual_seed(1))
    view0 = master.to(torch.bfloat16).float()
    step = 3e-5
    change = ((master + step).to(torch.bfloat16).float() - view0)[10:]
    ratio = float(change.mean()) / step
    print(f"dither={dither}: mean view change / update = {ratio:.3f}")
    if dither:
        assert ratio == pytest.approx(1.0, abs=0.05)
    else:
        assert ratio < 0.35  # only the smallest weights (grid step < 6e-5) move


def _gain_after_steps(model_dir, dtype: str, dither: bool, steps: int = 6, lr: float = 3e-6) -> float:
    """The policy-gradient surrogate's gain on a fixed batch after `steps` AdamW steps, in the compute view."""
    from rlkit.workers.fsdp_model import FSDPModel

    model = FSDPModel(str(model_dir), FSDPConfig(param_dtype=dtype, dither_master_weights=dither), torch.device("cpu"))
    model.setup_optimizer(OptimConfig(lr=lr, lr_warmup_steps=0, weight_decay=0.0), total_steps=steps)
    ids = torch.randint(3, 60, (8, 24), generator=torch.Generator().manual_seed(0))
    mask, response = torch.ones_like(ids), 8
    pos = mask.cumsum(1) - 1
    adv = torch.tensor([1.0, -1.0] * 4).unsqueeze(1)
    with torch.no_grad():
        lp0 = model.forward(ids, mask, pos, response).log_probs
    for _ in range(steps):
        (-(adv * model.forward(ids, mask, pos, response).log_probs).mean()).backward()
        model.clip_and_step(1e9)
    with torch.no_grad():
        return float((adv * (model.forward(ids, mask, pos, response).log_probs - lp0)).mean())


def test_bf16_training_from_a_bf16_checkpoint_moves_the_policy_as_fp32_does(tmp_path, process_group):
    model_dir = save_tiny_model(tmp_path / "tiny_bf16", tie_embeddings=True, dtype="bfloat16")
    fp32 = _gain_after_steps(model_dir, "float32", dither=True)
    dithered = _gain_after_steps(model_dir, "bfloat16", dither=True)
    on_grid = _gain_after_steps(model_dir, "bfloat16", dither=False)
    print(f"surrogate gain after 6 steps at lr 3e-6: fp32 {fp32:.5f}, bf16 dithered {dithered:.5f}, "
          f"bf16 on the grid {on_grid:.5f}")
    assert fp32 > 0
    assert dithered == pytest.approx(fp32, rel=0.25)
    assert on_grid < 0.5 * fp32  # the failure the dither fixes: updates below half a grid step never land


def test_dithering_leaves_what_the_model_computes_unchanged(tmp_path, process_group):
    from rlkit.workers.fsdp_model import FSDPModel

    model_dir = save_tiny_model(tmp_path / "tiny_bf16", tie_embeddings=True, dtype="bfloat16")
    ids = torch.randint(3, 60, (4, 16), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    outs, masters = [], []
    for dither in (False, True):
        model = FSDPModel(str(model_dir), FSDPConfig(param_dtype="bfloat16", dither_master_weights=dither),
                          torch.device("cpu"))
        with torch.no_grad():
            outs.append(model.forward(ids, mask, mask.cumsum(1) - 1, 6).log_probs)
        local = [p.to_local() if hasattr(p, "to_local") else p for p in model.module.parameters()]
        masters.append(torch.cat([t.detach().flatten() for t in local]))
    assert torch.equal(outs[0], outs[1])
    assert not torch.equal(masters[0], masters[1])
