"""No lost runs, no lost files, as a user meets them: real `rlkit` commands.

- pre-flight: bad inputs and unwritable outputs stop `rlkit train` (and `--dry-run`, exit 1) before Ray starts;
- checkpoints: `rlkit export` refuses a non-empty folder without --force and names the checkpoint's problem;
- `rlkit eval` / `rlkit reward score` check --out before the work;
- a real run whose latest checkpoint lost a shard resumes from the previous one (saying so), keeps both good
  checkpoints when it rotates, and logs each step once in metrics.jsonl;
- a real SIGINT to a real `rlkit train` prints one line with the step, the last checkpoint and the exact
  command that resumes, and that command does resume.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import time
import warnings
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from rlkit_cli.main import app
from tests.trainer.conftest import REPO, cli_env, read_metrics, rlkit_cmd, run_cli, toy_overrides, train_rows

RAY_STARTED = "Started a local Ray instance"


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


# ------------------------------------------------------------------------------------------- pre-flight


def test_unwritable_checkpoint_dir_stops_train_before_ray(toy_data, tiny_model, tmp_path):
    """The log dir is writable, the checkpoint dir is not: without the pre-flight check the run would train,
    then crash when it first saves."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    args = toy_overrides(toy_data, tiny_model, tmp_path, trainer__default_local_dir=blocker / "ckpt")
    start = time.perf_counter()
    res = run_cli("train", "grpo", *args, timeout=120)
    assert res.returncode == 1, res.stdout + res.stderr
    assert f"trainer.default_local_dir: cannot create {blocker / 'ckpt'} (Not a directory)" in res.stderr
    assert RAY_STARTED not in res.stdout + res.stderr and "Traceback" not in res.stderr
    assert (tmp_path / "logs").is_dir()  # the writable log dir was created by the check
    print(f"refused in {time.perf_counter() - start:.1f}s")


def test_dry_run_exits_1_and_lists_every_problem(toy_data, tiny_model, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1 not really")
    no_prompt = tmp_path / "no_prompt.parquet"
    pq.write_table(pa.table({"question": ["1+1"]}), no_prompt)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    args = toy_overrides(
        toy_data, tiny_model, tmp_path,
        data__train_files=f"[{bad},{no_prompt}]", data__val_files=tmp_path / "missing.parquet",
        actor_rollout_ref__model__path=tmp_path / "no-model", trainer__log_dir=blocker / "logs",
    )
    res = run_cli("train", "grpo", "--dry-run", *args, timeout=120)
    assert res.returncode == 1, res.stdout + res.stderr
    err = " ".join(res.stderr.split())  # rich may wrap long lines
    assert "pre-flight check found 5 problems" in err
    assert f"data.train_files: {bad} is not a readable parquet file" in err
    assert f"data.train_files: {no_prompt} has no 'prompt' column (it has question)" in err
    assert f"data.val_files: {tmp_path / 'missing.parquet'} does not exist" in err
    assert f"actor_rollout_ref.model.path: model '{tmp_path / 'no-model'}': no such file or folder" in err
    assert f"trainer.log_dir: cannot create {blocker / 'logs'} (Not a directory)" in err
    assert "Traceback" not in res.stderr

    ok = run_cli("train", "grpo", "--dry-run", *toy_overrides(toy_data, tiny_model, tmp_path / "ok"), timeout=120)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "pre-flight ok: model" in ok.stdout and "free" in ok.stdout
    assert (tmp_path / "ok" / "ckpt").is_dir() and (tmp_path / "ok" / "logs").is_dir()


def test_dry_run_refuses_a_disk_without_room_for_one_checkpoint(toy_data, tiny_model, tmp_path):
    """A model whose weights (a sparse file: no real disk used) need more room than the disk has."""
    import shutil

    big = tmp_path / "big-model"
    shutil.copytree(tiny_model, big)
    with open(big / "zz-extra.safetensors", "wb") as f:
        f.truncate(8 * 2**40)  # 8 TiB of float32 weights -> ~24 TiB of checkpoint
    res = run_cli("train", "grpo", "--dry-run",
                  *toy_overrides(toy_data, big, tmp_path, actor_rollout_ref__model__path=big), timeout=120)
    assert res.returncode == 1, res.stdout + res.stderr
    err = " ".join(res.stderr.split())
    assert f"trainer.default_local_dir: {tmp_path / 'ckpt'} has" in err
    assert "free, but one checkpoint of this model takes about 24.0 TB" in err


def test_lora_checkpoint_estimate_counts_the_adapter_not_the_model(tiny_model):
    """A LoRA actor checkpoint holds the adapter and its AdamW state: the estimate is rank x (in + out) per
    linear layer, checked against peft's own count of an all-linear adapter on the same model."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from rlkit.trainer.run.preflight import BYTES_PER_PARAM_IN_CHECKPOINT, checkpoint_size

    full = checkpoint_size(tiny_model)
    lora = checkpoint_size(tiny_model, lora_rank=8)
    peft_model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model),
                                LoraConfig(r=8, target_modules="all-linear"))
    adapter = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    assert lora == adapter * BYTES_PER_PARAM_IN_CHECKPOINT
    assert lora < full / 4
    assert checkpoint_size(tiny_model, roles=2, lora_rank=8) == lora + full  # the critic trains in full


# ------------------------------------------------------------------------------------------- export


def _save_checkpoint(root: Path, model_dir: Path, step: int = 1) -> Path:
    """A checkpoint laid out as the trainer writes it (DCP actor shards, hf_config, tokenizer, trainer state)."""
    import torch.distributed.checkpoint as dcp
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlkit.utils import checkpoint_io as ck

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tmp = ck.begin_checkpoint(root, step)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
        dcp.save({"model": model.state_dict()}, checkpoint_id=str(tmp / "actor"))
    model.config.save_pretrained(tmp / "actor" / "hf_config")
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(tmp / "actor" / "tokenizer")
    torch.save({"global_step": step}, tmp / "trainer_state.pt")
    return ck.commit_checkpoint(root, tmp, step, required=["trainer_state.pt", "actor/.metadata"])


def test_export_refuses_a_non_empty_folder_and_names_checkpoint_problems(tiny_model, tmp_path):
    ckpt = _save_checkpoint(tmp_path / "ckpt", tiny_model)
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    runner = CliRunner()
    res = runner.invoke(app, ["export", str(ckpt), str(out)])
    assert res.exit_code == 1 and "already holds files; pass --force" in res.output
    assert [p.name for p in out.iterdir()] == ["keep.txt"]

    res = runner.invoke(app, ["export", str(tmp_path / "ckpt"), str(out), "--force"])  # a root: its latest
    assert res.exit_code == 0, res.output
    from transformers import AutoModelForCausalLM

    exported = AutoModelForCausalLM.from_pretrained(out)
    original = AutoModelForCausalLM.from_pretrained(tiny_model)
    assert all(torch.equal(a, b) for a, b in zip(exported.state_dict().values(), original.state_dict().values()))

    res = runner.invoke(app, ["export", str(tmp_path / "nowhere"), str(tmp_path / "o2")])
    assert res.exit_code == 1 and "rlkit export:" in res.output and "does not exist" in res.output

    with open(ckpt / "actor" / "__0_0.distcp", "r+b") as f:  # same size, damaged bytes
        f.write(b"\0" * 64)
    res = runner.invoke(app, ["export", str(ckpt), str(tmp_path / "o3")])
    assert res.exit_code == 1 and f"rlkit export: cannot load {ckpt / 'actor'} (" in res.output

    (ckpt / "actor" / "__0_0.distcp").unlink()
    res = runner.invoke(app, ["export", str(ckpt), str(tmp_path / "o4")])
    text = " ".join(res.output.split())
    assert res.exit_code == 1 and "actor/__0_0.distcp is missing (listed in COMPLETE)" in text
    assert "resume_mode" not in res.output and "Traceback" not in res.output


# ------------------------------------------------------------------------------- --out before the work

REWARD_FN = '''
import os
from pathlib import Path

def compute_score(response, ground_truth, extra_info=None, **_):
    Path(os.environ["TEST_SCORED"]).touch()
    return 1.0
'''


def test_reward_score_checks_out_before_scoring(tmp_path, monkeypatch):
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"data_source": "x", "response": "a", "ground_truth": "a"}) + "\n")
    fn = tmp_path / "fn.py"
    fn.write_text(REWARD_FN)
    scored = tmp_path / "scored-marker"
    monkeypatch.setenv("TEST_SCORED", str(scored))
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    runner = CliRunner()
    res = runner.invoke(app, ["reward", "score", str(rows), "--custom-path", str(fn), "--out",
                              str(blocker / "out.jsonl")])
    text = " ".join(res.output.split())
    assert res.exit_code == 1 and f"--out {blocker / 'out.jsonl'}: {blocker} exists and is not a folder" in text
    assert not scored.exists()  # nothing was scored
    res = runner.invoke(app, ["reward", "score", str(rows), "--custom-path", str(fn), "--out", str(tmp_path)])
    assert res.exit_code == 1 and "is a folder" in res.output and not scored.exists()
    res = runner.invoke(app, ["reward", "score", str(rows), "--custom-path", str(fn), "--out",
                              str(tmp_path / "new" / "out.jsonl")])
    assert res.exit_code == 0, res.output
    assert scored.exists() and json.loads((tmp_path / "new" / "out.jsonl").read_text())["score"] == 1.0


def test_eval_checks_out_before_generating(toy_data, tiny_model, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    res = CliRunner().invoke(app, ["eval", str(tiny_model), "--data", str(toy_data / "test.parquet"), "--backend",
                                   "hf", "--limit", "2", "--out", str(blocker / "gen.jsonl")])
    assert res.exit_code == 1, res.output
    assert f"--out {blocker / 'gen.jsonl'}: {blocker} exists and is not a folder" in " ".join(res.output.split())
    assert "generating" not in res.output  # failed before the model was even loaded


# --------------------------------------------------------------------------- resume after a broken save


# resume_mode=auto skipping a broken latest checkpoint (a shard lost after its save): tests/trainer/test_cli_resume.py


# ----------------------------------------------------------------------------------------- Ctrl-C


def test_interrupt_line_replaces_the_resume_setting_and_quotes_arguments():
    from rlkit.trainer.run.interrupt import TrainingInterrupted

    argv = ["/opt/venv/bin/rlkit", "train", "grpo", "trainer.resume_mode=disable", "trainer.logger=[file]",
            "trainer.experiment_name=my run"]
    line = TrainingInterrupted(7, 100, Path("/ck/global_step_6")).line(argv)
    assert line == ("interrupted at step 7 of 100; last complete checkpoint: /ck/global_step_6; resume with: "
                    "/opt/venv/bin/rlkit train grpo 'trainer.logger=[file]' 'trainer.experiment_name=my run' "
                    "trainer.resume_mode=auto")
    fresh = TrainingInterrupted(None, None, None).line(["python", "train", "grpo", "trainer.resume_mode=disable"])
    assert fresh == ("interrupted before training started; no checkpoint saved yet; start again with: "
                     "rlkit train grpo trainer.resume_mode=disable")
    assert TrainingInterrupted(0, 5, None).line().startswith("interrupted before the first step; no checkpoint")


def test_ctrl_c_that_a_library_wrapped_in_its_own_error_is_still_one_line(monkeypatch):
    """Ctrl-C while the config loads can land inside OmegaConf, which turns the KeyboardInterrupt into one of its own
    errors (seen under load: a traceback ending `object_type=RuntimeConf`, exit 1). The signal was ours: one line,
    exit 130."""
    import rlkit_cli.commands.train as train_cmd

    def load_config_hit_by_ctrl_c(*args, **kwargs):
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
        except KeyboardInterrupt:
            raise ValueError("could not build the config\n    object_type=RuntimeConf") from None

    monkeypatch.setattr(train_cmd, "_train", load_config_hit_by_ctrl_c)
    monkeypatch.setattr(train_cmd, "leave_now", lambda code: None)
    result = CliRunner().invoke(app, ["train", "grpo", "trainer.logger=[file]"])
    assert result.exit_code == 130, result.output
    assert result.output.strip().splitlines()[-1].startswith("interrupted before training started")


def _interrupt(cmd: list[str], out: Path, ready, timeout: float = 300, sigterm: bool = False) -> tuple[int, str, str]:
    """Start `cmd` in its own process group, wait for `ready()`, then send SIGINT to the group (what a
    terminal's Ctrl-C does), or SIGTERM to the driver alone (what `kill PID` or a scheduler does);
    returns (exit status, stdout, stderr)."""
    with open(out / "stdout", "w") as so, open(out / "stderr", "w") as se:
        proc = subprocess.Popen(cmd, stdout=so, stderr=se, env=cli_env(), cwd=REPO, start_new_session=True)
        try:
            deadline = time.monotonic() + timeout
            while not ready() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
            assert proc.poll() is None and ready(), (out / "stdout").read_text() + (out / "stderr").read_text()
            if sigterm:
                proc.send_signal(signal.SIGTERM)
            else:
                os.killpg(proc.pid, signal.SIGINT)
            rc = proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
            _kill_group(proc.pid)
    return rc, (out / "stdout").read_text(), (out / "stderr").read_text()


@pytest.mark.slow
def test_ctrl_c_then_sigterm_print_one_line_with_the_step_checkpoint_and_resume_command(toy_data, tiny_model, tmp_path):
    ckpt = tmp_path / "ckpt"
    args = toy_overrides(toy_data, tiny_model, tmp_path, data__train_batch_size=8, actor_rollout_ref__rollout__n=4,
                         actor_rollout_ref__actor__ppo_mini_batch_size=8, trainer__total_training_steps=5000,
                         trainer__save_freq=1)
    first = tmp_path / "first"
    first.mkdir()
    rc, stdout, stderr = _interrupt(rlkit_cmd("train", "grpo", *args), first,
                                    lambda: len(list(ckpt.glob("global_step_*"))) >= 2)
    assert rc == 130, stdout[-2000:] + stderr[-3000:]
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    line = stderr.strip().splitlines()[-1]
    from rlkit.utils.checkpoint_io import find_latest_checkpoint

    latest = find_latest_checkpoint(ckpt)
    step = int(line.split("interrupted at step ")[1].split(" ")[0])
    assert line.startswith(f"interrupted at step {step} of 5000; last complete checkpoint: {latest}; resume with: ")
    assert int(latest.name.rsplit("_", 1)[1]) in (step, step - 1)  # that step was saved, or was running
    command = shlex.split(line.split("; resume with: ", 1)[1])
    assert command[:3] == rlkit_cmd("train", "grpo") and command[-1] == "trainer.resume_mode=auto"
    assert "trainer.resume_mode=disable" not in command  # the run's own setting was replaced

    # the printed command, run as printed, resumes from that checkpoint; stop it with SIGTERM (`kill PID`, a
    # scheduler's stop): the same clean stop as Ctrl-C, exit 143; without re-arming after ray.init, Ray's C++
    # handler printed ~30 lines of `*** SIGTERM received` stack dumps
    second = tmp_path / "second"
    second.mkdir()
    resumed_line = f"resuming from {latest}"
    rc, stdout, stderr = _interrupt(command, second, lambda: resumed_line in (second / "stderr").read_text()
                                    and len(list(ckpt.glob("global_step_*"))) >= 2
                                    and find_latest_checkpoint(ckpt) != latest, sigterm=True)
    assert rc == 143, stdout[-2000:] + stderr[-3000:]
    assert "SIGTERM received" not in stderr + stdout and "Traceback" not in stderr, stderr[-3000:]
    line = stderr.strip().splitlines()[-1]
    assert line.startswith("interrupted at step ") and " by SIGTERM; last complete checkpoint: " in line, line
    assert line.endswith("trainer.resume_mode=auto")
    steps = [r["step"] for r in train_rows(read_metrics(tmp_path / "logs"))]
    assert steps == list(range(1, len(steps) + 1))  # across both runs: every step once, none twice, none lost
