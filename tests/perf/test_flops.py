"""perf/mfu's arithmetic: model FLOPs per token, step FLOPs by phase, and where the peak comes from."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest
import torch

from rlkit.utils import flops

# SmolLM2-135M (Llama, GQA 9/3 heads, tied embeddings): 134.5M weights in the matmuls per token
SMOL = SimpleNamespace(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                       head_dim=64, intermediate_size=1536, vocab_size=49152, hidden_act="silu")


def test_params_per_token_match_the_model():
    per_layer = 576 * 576 * 2 + 576 * 192 * 2 + 3 * 576 * 1536
    assert flops.matmul_params_per_token(SMOL) == 30 * per_layer + 576 * 49152 == 134_479_872


def test_forward_flops_dense_plus_causal_attention():
    dense = 2 * 134_479_872
    pair = 4 * 30 * 9 * 64
    assert flops.forward_flops(SMOL, [1]) == dense + pair
    assert flops.forward_flops(SMOL, [10, 3]) == dense * 13 + pair * (55 + 6)
    # a trained token costs 3 forwards, a scored one 1
    assert flops.step_flops(SMOL, [10], train_passes=2, score_passes=1) == 7 * flops.forward_flops(SMOL, [10])


def test_meter_counts_the_phases_that_ran():
    """The meter reads the step's phases (`StepResult.phases`), not metric names."""
    meter = flops.MFUMeter(SMOL, peak=1e12, source="test", actor_epochs=2, critic_epochs=3)
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 0, 0]])
    fwd = flops.forward_flops(SMOL, [3, 2])
    assert meter.step_flops(mask, {"gen": 5.0, "reward": 1.0, "update_actor": 1.0}) == 6 * fwd
    assert meter.step_flops(mask, ["update_actor", "old_log_prob", "ref"]) == 8 * fwd
    ppo = ["gen", "old_log_prob", "ref", "values", "adv", "update_critic", "update_actor", "update_weights"]
    assert meter.step_flops(mask, ppo) == (2 * 3 + 3 * 3 + 3) * fwd
    assert meter.step_flops(mask, {"timing_s/update_actor": 1.0}) == 0  # metric names are not phases
    assert meter(5e11, 2.0) == pytest.approx(0.25)


def test_cpu_peak_is_this_machines_rate_for_the_dtype_in_use(tmp_path, monkeypatch):
    """Without a peak file: the precision probe's cached rates of this machine at the workers' thread count,
    fp32 or bf16 by the dtype in use, whatever $RLKIT_CPU_COMPUTE_DTYPE pins (the tests pin float32)."""
    from rlkit.utils import cpu_precision

    monkeypatch.delenv(flops.PEAK_FILE_ENV, raising=False)
    monkeypatch.setenv(cpu_precision.CACHE_ENV, str(tmp_path))
    isa = cpu_precision.read_isa()
    rates = {1: (50.0, 120.0), 2: (90.0, 230.0)}
    for threads, (fp32, bf16) in rates.items():
        cpu_precision.measured_rates(threads, isa, tmp_path, measure_fn=lambda t, r=(fp32, bf16): r)
    assert cpu_precision.choose(2).reason.startswith("$")  # the override does not hide the measurement
    peak, source = flops.peak_flops("cpu", workers=1, dtype=torch.bfloat16, cores_per_worker=2)
    assert peak == pytest.approx(230e9) and "bf16" in source and "2 thread(s)" in source and "cached" in source
    cores = min(2, os.cpu_count() or 1)  # two one-thread workers, if the machine has the cores
    peak, _ = flops.peak_flops("cpu", workers=2, dtype=torch.float32, cores_per_worker=1)
    assert peak == pytest.approx(cores * 50e9)


def test_cpu_peak_from_a_bench_peak_file(tmp_path, monkeypatch):
    path = tmp_path / "peak.json"
    path.write_text(json.dumps({"cores": 2, "fp32_gflops": 150.0, "fp32_gflops_per_core": 90.0,
                                "bf16_gflops": 60.0, "bf16_gflops_per_core": 40.0}))
    monkeypatch.setenv(flops.PEAK_FILE_ENV, str(path))
    peak, source = flops.peak_flops("cpu", workers=1, dtype=torch.float32, cores_per_worker=min(2, os.cpu_count()))
    assert peak == pytest.approx(min(2, os.cpu_count()) * 90e9) and str(path) in source
    peak, _ = flops.peak_flops("cpu", workers=1, dtype=torch.bfloat16, cores_per_worker=1)
    assert peak == pytest.approx(40e9)


def test_gpu_spec_peaks():
    assert flops.gpu_peak_flops("NVIDIA H100 80GB HBM3", torch.bfloat16) == 989e12
    assert flops.gpu_peak_flops("NVIDIA H100 PCIe", torch.bfloat16) == 756e12
    assert flops.gpu_peak_flops("NVIDIA A100-SXM4-80GB", torch.float32) == 19.5e12
    assert flops.gpu_peak_flops("Some Future GPU", torch.bfloat16) is None
    peak, source = flops.peak_flops("cuda", workers=8, dtype=torch.bfloat16, device_name="NVIDIA H200")
    assert peak == 8 * 989e12 and source == "spec sheet: NVIDIA H200 bf16"


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral"])
def test_moe_total_and_active_parameters_match_the_model(family):
    """Per token: the active experts only; in total: every expert. Checked against the real module's weights."""
    from rlkit.testing import build_tiny_moe

    model, _ = build_tiny_moe(family)
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))  # attention, lm_head
    experts = [p for n, p in model.named_parameters() if ".experts." in n]  # fused: (E, ...) per projection
    total = flops.matmul_params_total(model.config)
    assert total == linear + sum(p.numel() for p in experts)
    cfg = model.config
    n_experts = getattr(cfg, "num_experts", None) or cfg.num_local_experts
    per_expert = sum(p.numel() for p in experts) // n_experts
    assert flops.matmul_params_per_token(cfg) == linear + per_expert * cfg.num_experts_per_tok
    assert flops.matmul_params_total(SMOL) == flops.matmul_params_per_token(SMOL)  # dense: the same


def test_the_run_summary_shows_an_moe_policys_active_and_total_weights(tmp_path):
    from rlkit.testing import save_tiny_model, save_tiny_moe
    from rlkit.trainer.run.run_summary import memory_rows, moe_params

    moe = moe_params(str(save_tiny_moe(tmp_path / "moe", "qwen3_moe")))
    assert 0 < moe["moe_active_params"] < moe["moe_total_params"]
    assert moe_params(str(save_tiny_model(tmp_path / "dense"))) == {}
    rows = dict(memory_rows({"params": 1e6, "trainable_params": 1e6, "optimizer_state_mb": 8.0, "grad_mb": 4.0, **moe}))
    line = rows["MoE weights per token (matmuls)"]
    assert line.endswith("total") and "active of" in line
    assert dict(memory_rows(moe)) == {"MoE weights per token (matmuls)": line}
