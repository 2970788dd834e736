"""`bench/gpu_check.py --host inprocess --device cpu`: the device check's CPU mode, as the lent GPU machine runs it.

That machine has no Ray, no vLLM and no debugpy, so the run here sees a copy of the venv's site-packages without
them (a folder of links to every other entry, on `python -S`): an import of any of them on the path the check
takes fails the run, as it would there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ABSENT_THERE = ("ray", "vllm", "debugpy")  # top-level packages the lent GPU machine does not have


def _site_without(tmp_path: Path, absent: tuple[str, ...]) -> Path:
    """A site folder linking every entry of this interpreter's site-packages but `absent`'s (and their metadata)."""
    site_packages = next(Path(p) for p in sys.path if p.endswith("site-packages") and Path(p).is_dir())
    farm = tmp_path / "site"
    farm.mkdir()
    for entry in site_packages.iterdir():
        top = entry.name.split("-")[0].split(".")[0].lower()
        if top in absent or top.startswith(tuple(f"{a}_" for a in absent)):
            continue
        (farm / entry.name).symlink_to(entry)
    return farm


@pytest.mark.slow
def test_cpu_mode_passes_without_ray_vllm_debugpy(tmp_path):
    farm = _site_without(tmp_path, ABSENT_THERE)
    out = tmp_path / "gpu_check.json"
    boot = ("import runpy, site, sys; site.addsitedir(sys.argv[1]); sys.argv = sys.argv[2:]; "
            "runpy.run_path(sys.argv[0], run_name='__main__')")
    cmd = [sys.executable, "-S", "-c", boot, str(farm), str(ROOT / "bench" / "gpu_check.py"), "--host", "inprocess",
           "--device", "cpu", "--steps", "1", "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RLKIT_VERBOSE": "0"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    results = json.loads(out.read_text())["results"]
    assert set(results) == {"env", "numerics", "grpo_step", "weight_sync"}
    assert all(r["ok"] for r in results.values()), results
    env_row = results["env"]
    assert set(ABSENT_THERE) <= set(env_row["optional_absent"]) and env_row["ray_or_vllm_imported"] == []
    # the numbers behind the verdicts: float32 equals the CPU reference, bf16 within its tolerance
    assert results["numerics"]["diffs_mean_max"]["float32"]["log_probs"][1] < 1e-3
    assert 0 < results["numerics"]["diffs_mean_max"]["bfloat16/fused"]["log_probs"][0] < 0.05
    eager = results["grpo_step"]["runs"]["eager"]
    assert eager["update_actor"] > 0 and eager["metric:actor/grad_norm"] > 0
    assert {"generate_sequences", "compute_log_prob", "update_actor", "sync_weights"} <= set(eager["memory_peaks_gb"])
    sync = results["weight_sync"]
    assert sync["max_abs_diff_vs_cpu"] == 0.0 and sync["engine_vs_trainer"] == 0.0
    assert sync["engine_moved_from_checkpoint"] > 0 and sync["tensors"] == sync["stream"]["tensors"]
