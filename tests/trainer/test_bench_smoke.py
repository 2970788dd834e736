"""`bench/grpo_step.py` runs end to end on the tiny model (2 short steps) and writes its JSON."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.trainer.conftest import REPO, cli_env


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
    """The prepared device check, in its CPU mode (gloo instead of NCCL, float32 and bf16): every
    check passes and its JSON holds the numbers; an unknown check name exits 2."""
    for dtype in ("float32", "bfloat16"):
        out = tmp_path / f"gpu_check_{dtype}.json"
        cmd = [sys.executable, "bench/gpu_check.py", "--device", "cpu", "--dtype", dtype, "--hidden", "128",
               "--layers", "2", "--steps", "2", "--out", str(out)]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=cli_env(), cwd=REPO)
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
        results = json.loads(out.read_text())["results"]
        assert set(results) == {"env", "numerics", "grpo_step"} and all(r["ok"] for r in results.values())
        assert results["numerics"]["max_abs_diff"] <= results["numerics"]["tolerance"][1]
        assert results["grpo_step"]["step_s"] > 0
    bad = subprocess.run([sys.executable, "bench/gpu_check.py", "--checks", "nope"], capture_output=True, text=True,
                         env=cli_env(), cwd=REPO)
    assert bad.returncode == 2
