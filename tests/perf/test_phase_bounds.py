"""bench/phase_bounds.py: each phase's bound from a peak file and a step's metrics, by hand on a small config."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from transformers import LlamaConfig

from rlkit.utils.flops import forward_flops, matmul_params_per_token

REPO = Path(__file__).resolve().parents[2]


def _module():
    spec = importlib.util.spec_from_file_location("phase_bounds", REPO / "bench" / "phase_bounds.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_bounds_follow_the_flops_and_bandwidth_of_the_measured_peak(tmp_path):
    pb = _module()
    peak_file = tmp_path / "peak.json"
    peak_file.write_text(json.dumps({"fp32_gflops": 100.0, "bf16_gflops": 400.0, "read_gbs": 10.0, "copy_gbs": 8.0}))
    peak = pb.Peak.from_file(peak_file)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=1000)
    row = {"prompt_length/mean": 20.0, "response_length/mean": 30.0, "response_length/max": 40.0,
           "timing_s/gen": 2.0, "timing_s/old_log_prob": 1.0, "timing_s/update_actor": 3.0,
           "timing_s/update_weights": 0.5}
    got = {b.phase: b for b in pb.phase_bounds(cfg, [row, {**row, "timing_s/gen": 4.0}], 16, peak, "bfloat16",
                                               "float32")}
    assert set(got) == {"gen", "old_log_prob", "update_actor", "update_weights"}  # no ref phase timed
    fwd, params = forward_flops(cfg, [50] * 16), matmul_params_per_token(cfg)
    assert got["old_log_prob"].bound_s == pytest.approx(fwd / 400e9)
    assert got["update_actor"].bound_s == pytest.approx(3 * fwd / 400e9 + params * 28 / 8e9)
    gen = forward_flops(cfg, [20] * 16) / 100e9 + 40 * params * 4 / 10e9  # the engine's fp32 peak and weights
    assert got["gen"].bound_s == pytest.approx(gen)
    assert got["gen"].measured_s == 3.0  # the median of the steps
    assert got["update_weights"].ratio == pytest.approx(0.5 / (2 * params * 4 / 8e9))
