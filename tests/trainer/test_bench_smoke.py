"""The benchmarks run end to end at toy sizes and write their JSON (grpo_step, gpu_check, moe_step)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.trainer.conftest import REPO, cli_env

CHECKS = ("env", "numerics", "grpo_step", "vllm_sync")  # bench/gpu_check.py's


@pytest.mark.slow
def test_grpo_step_bench_writes_a_phase_table(tmp_path):
    out = tmp_path / "grpo_step.json"
    cmd = [sys.executable, "bench/grpo_step.py", "--steps", "2", "--prompts", "2", "--n", "2",
           "--response-length", "8", "--out", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=cli_env(), cwd=REPO)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "update_actor" in res.stdout and "tokens/s" in res.stdout
    result = json.loads(out.read_text())
    phases = result["phases_s"]
    assert all(phases[p] is not None and phases[p] >= 0 for p in ("gen", "old_log_prob", "ref", "update_actor"))
    assert result["step_s"] > 0 and result["tokens_per_s"] > 0 and len(result["per_step"]) == 2


@pytest.mark.slow
def test_gpu_check_runs_its_cpu_mode(tmp_path):
    """The prepared device check's Ray mode on CPU (gloo instead of NCCL, float32): every check passes and its JSON
    holds the numbers; an unknown check name exits 2. (bf16 numerics: tests/perf/test_gpu_check_cpu.py, in process.)"""
    out = tmp_path / "gpu_check_float32.json"
    cmd = [sys.executable, "bench/gpu_check.py", "--device", "cpu", "--dtype", "float32", "--hidden", "128",
           "--layers", "2", "--steps", "2", "--checks", ",".join(CHECKS), "--out", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=cli_env(), cwd=REPO)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    results = json.loads(out.read_text())["results"]
    assert set(results) == set(CHECKS) and all(r["ok"] for r in results.values())
    assert results["numerics"]["max_abs_diff"] <= results["numerics"]["tolerance"][1]
    assert results["grpo_step"]["step_s"] > 0
    sync = results["vllm_sync"]
    for level in ("1", "2"):  # engine == trainer after each sync, != the previous weights; the lifecycle's order
        row = sync["levels"][level]
        assert row["order_ok"] and max(row["fresh_max"]) < 1e-3 and min(row["stale_mean"]) > 1e-2, row
    bad = subprocess.run([sys.executable, "bench/gpu_check.py", "--checks", "nope"], capture_output=True, text=True,
                         env=cli_env(), cwd=REPO)
    assert bad.returncode == 2


@pytest.mark.slow
def test_moe_step_bench_compares_equal_active_sizes(tmp_path):
    """bench/moe_step.py: the dense and the MoE model it times pass the same matmul weights per token, and the
    MoE holds more in total (its experts)."""
    out = tmp_path / "moe_step.json"
    cmd = [sys.executable, "bench/moe_step.py", "--hidden", "128", "--layers", "1", "--rows", "2", "--length", "32",
           "--reps", "1", "--out", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=cli_env(), cwd=REPO)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    dense, moe = json.loads(out.read_text())["results"]
    assert dense["active_matmul_params_per_token"] == moe["active_matmul_params_per_token"]
    assert moe["matmul_params_total"] > dense["matmul_params_total"]
    assert dense["step_s_median"] > 0 and moe["step_s_median"] > 0
