"""`rlkit train grpo` as a user runs it (a subprocess), and resuming after a SIGKILL.

Run A: 4 uninterrupted steps, checkpoint every step.
Run B: the same command, SIGKILLed while it is inside step 3 (its reward function blocks once the
       step-2 checkpoint exists, the test then kills the process from outside, like an OOM killer).
       Then a half-written checkpoint is planted: `global_step_3.tmp-<dead pid>` and a
       `global_step_3` without its COMPLETE marker; and the latest complete checkpoint, `global_step_2`,
       loses a shard after its save (a disk or a copy that lost a file).
Run C: the same command again (resume_mode=auto): it must skip the broken global_step_2 with one line, fall back
       to global_step_1, run steps 2-4 on the same prompts in the same order as run A, sample the same responses
       (sampling seeds and restored weights), log the same losses and rewards (restored optimizer state), log each
       step once (B's step 2 is replaced by C's), and leave only good checkpoints (the broken folder is replaced).

The reward function (a custom_reward_function file) logs every scored sample's dataset index
and response, which is how the data order of each step is compared.

Full fine-tuning only: the LoRA variant of the three runs (the checkpoint holds the adapter and its optimizer state,
the base comes from the model folder again on resume) was dropped for the suite's time budget (~130 s); LoRA's
checkpoint contents, export and eval are tests/trainer/test_lora_runs.py's.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.trainer.conftest import REPO, cli_env, read_metrics, rlkit_cmd, toy_overrides, train_rows

STEPS, KILL_IN_STEP, BSZ, N = 4, 3, 8, 4
ROWS = BSZ * N  # samples scored per step

REWARD_FN = '''
import json, os, time
from pathlib import Path
from rlkit.reward.toy_copy import toy_copy_score

def compute_score(response, ground_truth, extra_info=None, **_):
    with open(os.environ["TEST_REWARD_LOG"], "a") as f:
        f.write(json.dumps({"pid": os.getpid(), "index": int(extra_info["index"]), "response": response}) + "\\n")
    block = os.environ.get("TEST_BLOCK_WHEN")
    if block and Path(block).exists():  # the checkpoint of step k exists: we are in step k+1
        Path(os.environ["TEST_BLOCKED"]).touch()
        time.sleep(3600)
    return toy_copy_score(response, ground_truth, extra_info)
'''


MODES = {"full": {}}


def _overrides(toy_data: Path, tiny_model: Path, out: Path, reward_fn: Path, mode: str = "full") -> list[str]:
    return [f"{k}={v}" for k, v in MODES[mode].items()] + toy_overrides(
        toy_data, tiny_model, out,
        data__train_batch_size=BSZ, actor_rollout_ref__rollout__n=N,
        actor_rollout_ref__actor__ppo_mini_batch_size=BSZ,
        trainer__total_training_steps=STEPS, trainer__save_freq=1, trainer__resume_mode="auto",
        trainer__max_actor_ckpt_to_keep=2,
        custom_reward_function__path=reward_fn, reward_model__timeout_s=3600,
    )


def _reward_log(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _by_step(entries: list[dict], first_step: int) -> dict[int, Counter]:
    """(index, response) of the scored samples, ROWS per step: steps run one after another, the
    samples of one step are scored in any order."""
    return {
        first_step + i: Counter((e["index"], e["response"]) for e in entries[i * ROWS : (i + 1) * ROWS])
        for i in range(len(entries) // ROWS)
    }


@pytest.fixture(scope="module", params=list(MODES))
def runs(toy_data, tiny_model, tmp_path_factory, request):
    mode = request.param
    root = tmp_path_factory.mktemp(f"cli_{mode}")
    reward_fn = root / "reward_fn.py"
    reward_fn.write_text(REWARD_FN)
    result = {}

    # A: uninterrupted
    a = root / "a"
    env = cli_env() | {"TEST_REWARD_LOG": str(root / "a_rewards.jsonl")}
    start = time.perf_counter()
    res = subprocess.run(rlkit_cmd("train", "grpo", *_overrides(toy_data, tiny_model, a, reward_fn, mode)),
                         capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    result["a"] = (a, res, time.perf_counter() - start)

    # B: killed during step 3
    b = root / "b"
    blocked = root / "b_blocked"
    env = cli_env() | {
        "TEST_REWARD_LOG": str(root / "b_rewards.jsonl"),
        "TEST_BLOCK_WHEN": str(b / "ckpt" / f"global_step_{KILL_IN_STEP - 1}"),
        "TEST_BLOCKED": str(blocked),
    }
    cmd = rlkit_cmd("train", "grpo", *_overrides(toy_data, tiny_model, b, reward_fn, mode))
    with open(root / "b_output.txt", "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO, start_new_session=True)
        try:
            deadline = time.monotonic() + 300
            while not blocked.exists() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
            assert blocked.exists(), f"run B never reached step {KILL_IN_STEP}: {(root / 'b_output.txt').read_text()}"
            os.kill(proc.pid, signal.SIGKILL)
            result["b_rc"] = proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
            _kill_group(proc.pid)  # Ray's processes of that run, should any have outlived it
    ckpt = b / "ckpt"
    torn_tmp = ckpt / f"global_step_{KILL_IN_STEP}.tmp-999999999"  # a pid that cannot be alive
    (torn_tmp / "actor").mkdir(parents=True)
    (torn_tmp / "actor" / "__0_0.distcp").write_bytes(b"half a shard")
    torn = ckpt / f"global_step_{KILL_IN_STEP}"
    (torn / "actor").mkdir(parents=True)
    (torn / "trainer_state.pt").write_bytes(b"garbage")
    (ckpt / f"global_step_{KILL_IN_STEP - 1}" / "actor" / "__0_0.distcp").unlink()  # a shard lost after the save
    result["b"] = b

    # C: resume B
    env = cli_env() | {"TEST_REWARD_LOG": str(root / "c_rewards.jsonl")}
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    result["c"] = res
    result["root"] = root
    result["mode"] = mode
    return result


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


@pytest.mark.slow
def test_cli_train_writes_checkpoints_and_metrics(runs):
    out, res, seconds = runs["a"]
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "Traceback" not in res.stderr
    assert "run summary" in res.stdout
    print(f"rlkit train grpo, {STEPS} steps: {seconds:.1f}s wall (process start to exit)")
    ckpt = out / "ckpt"
    assert sorted(p.name for p in ckpt.iterdir() if p.name.startswith("global_step")) == [
        f"global_step_{STEPS - 1}", f"global_step_{STEPS}"]  # keep-last-2
    last = ckpt / f"global_step_{STEPS}"
    for name in ("COMPLETE", "trainer_state.pt", "config.json", "actor/hf_config/config.json",
                 "actor/tokenizer/tokenizer.json", "actor/scheduler.pt"):
        assert (last / name).is_file(), name
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == str(STEPS)
    assert (last / "actor" / "lora.json").is_file() == (runs["mode"] == "lora")  # LoRA: the adapter's base
    rows = train_rows(read_metrics(out / "logs"))
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert all(r["reward/errors"] == 0 for r in rows)
    assert all(key in rows[-1] for key in ("actor/pg_loss", "timing_s/step", "perf/throughput"))


@pytest.mark.slow
def test_resume_after_sigkill_continues_with_the_same_data_and_rng(runs):
    root = runs["root"]
    assert runs["b_rc"] == -signal.SIGKILL
    res = runs["c"]
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    ckpt = runs["b"] / "ckpt"
    out = " ".join((res.stdout + res.stderr).split())
    broken, resumed = ckpt / f"global_step_{KILL_IN_STEP - 1}", KILL_IN_STEP - 2
    assert f"trainer.resume_mode=auto: skipping {broken}: actor/__0_0.distcp is missing" in out, out[-3000:]
    assert f"fell back to the previous complete checkpoint {ckpt / f'global_step_{resumed}'}" in out
    assert f"resuming from {ckpt / f'global_step_{resumed}'}" in out

    a_log, b_log, c_log = (_reward_log(root / f"{x}_rewards.jsonl") for x in "abc")
    a_steps = _by_step(a_log, 1)
    b_steps = _by_step(b_log[: (KILL_IN_STEP - 1) * ROWS], 1)
    c_steps = _by_step(c_log, resumed + 1)
    assert len(c_log) == (STEPS - resumed) * ROWS  # C ran steps 2..4 only
    for step in range(1, KILL_IN_STEP):  # before the kill B was A
        assert b_steps[step] == a_steps[step]
    # the killed step had started on A's step-3 prompts
    assert {e["index"] for e in b_log[(KILL_IN_STEP - 1) * ROWS :]} <= {i for i, _ in a_steps[KILL_IN_STEP]}
    for step in range(resumed + 1, STEPS + 1):
        # same prompts (data order) and the very same sampled responses (sampling seeds + weights restored)
        assert c_steps[step] == a_steps[step], f"step {step} differs after resume"

    a_rows = {r["step"]: r for r in train_rows(read_metrics(root / "a" / "logs"))}
    bc_rows = train_rows(read_metrics(runs["b"] / "logs"))  # B's step 1, then C's 2-4 (same log dir): each once
    assert [r["step"] for r in bc_rows] == list(range(1, STEPS + 1))
    for r in bc_rows:
        for key in ("critic/score/mean", "actor/pg_loss", "actor/grad_norm", "actor/lr", "response_length/mean"):
            assert r[key] == pytest.approx(a_rows[r["step"]][key], rel=1e-5, abs=1e-7), (r["step"], key)

    assert not (ckpt / f"global_step_{KILL_IN_STEP}.tmp-999999999").exists()  # the stale temp dir was cleaned up
    assert (ckpt / f"global_step_{STEPS}" / "COMPLETE").is_file()
    assert (ckpt / f"global_step_{KILL_IN_STEP}" / "COMPLETE").is_file()  # the torn dir was replaced by a real one
    from rlkit.utils.checkpoint_io import broken_checkpoints, list_checkpoints

    # keep-last-2: the broken step 2 was saved again by C (replacing the folder), then rotated out
    assert [s for s, _ in list_checkpoints(ckpt)] == [STEPS - 1, STEPS] and not broken_checkpoints(ckpt)
