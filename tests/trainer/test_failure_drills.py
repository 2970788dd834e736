"""Failure drills (issue 44 item 4), each as a user meets it:

- the disk fills up while a checkpoint is written (a write hook raising ENOSPC mid-write, in the model shard, in
  trainer_state.pt, or in a worker's shard): one line, the partial copy removed, the previous checkpoint intact and
  resumable, each step logged once after the resume;
- `--debug nan` at a terminal, driven in a pseudo-terminal: a NaN advantage at step 4 opens pdb in the driver, where
  `what` and the rows are inspected; then the DRIVER is SIGKILLed mid-step (paused in step 4), and a run with
  `trainer.resume_mode=auto` continues from the last complete checkpoint (step 2), rewrites the metrics past it
  (step 3's row is logged once), pauses at the next NaN (step 5), and `c` stops it with the one line.
"""

from __future__ import annotations

import errno
import json
import os
import re
import select
import signal
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from rlkit.trainer.run import trainer_base
from rlkit.trainer.run.trainer_base import TrainerBase
from rlkit.utils.checkpoint_io import LATEST, CheckpointError, is_complete, list_checkpoints
from tests.trainer.conftest import cli_env, read_metrics, rlkit_cmd, toy_overrides

SHARD = 64 * 1024


class Loader:
    def __init__(self) -> None:
        self.batches = 0

    def state_dict(self) -> dict:
        return {"batches": self.batches}

    def load_state_dict(self, state: dict) -> None:
        self.batches = state["batches"]


class Rows:
    """The metrics file's rows (step numbers), rewound on resume as the file tracker does."""

    def __init__(self) -> None:
        self.rows: list[int] = []

    def log(self, metrics: dict, step: int) -> None:
        self.rows.append(step)

    def rewind(self, step: int) -> None:
        self.rows = [s for s in self.rows if s <= step]


class Disk:
    """A write hook: after `free` more bytes every write raises ENOSPC (None: unlimited)."""

    def __init__(self, free: int | None = None) -> None:
        self.free = free

    def write(self, path: Path, data: bytes) -> None:
        with open(path, "wb") as fh:
            for i in range(0, len(data), SHARD):
                chunk = data[i:i + SHARD]
                if self.free is not None and self.free < len(chunk):
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
                fh.write(chunk)
                if self.free is not None:
                    self.free -= len(chunk)


class ShardTrainer(TrainerBase):
    """Each step changes a 1 MB "model" that save_state writes through the disk hook; saves every 2 steps."""

    def __init__(self, root: Path, disk: Disk, resume: str = "disable", tracker: Rows | None = None) -> None:
        self.cfg = SimpleNamespace(trainer=SimpleNamespace(val_before_train=False, test_freq=-1, save_freq=2,
                                                           max_worker_restarts=0, resume_mode=resume,
                                                           max_actor_ckpt_to_keep=2))
        self.total_steps, self.ckpt_root, self.disk = 6, root, disk
        self.train_loader, self.tracker = Loader(), tracker or Rows()
        self.model = bytes(1 << 20)

    def run_step(self) -> dict:
        self.train_loader.batches += 1
        self.model = bytes([self.global_step]) * (1 << 20)
        return {"loss": float(self.global_step)}

    def save_state(self, folder: Path) -> None:
        self.disk.write(folder / "model.bin", self.model)

    def load_state(self, folder: Path) -> None:
        self.model = (folder / "model.bin").read_bytes()

    def required_files(self) -> list[str]:
        return ["model.bin"]


@pytest.fixture
def plain_config(monkeypatch):
    monkeypatch.setattr(trainer_base, "_plain", lambda cfg: {"trainer": vars(cfg.trainer)})


def _check_full_disk_stop(root: Path, exc: CheckpointError) -> None:
    line = str(exc)
    assert "\n" not in line
    assert line.startswith("checkpoint of step 4 not written: No space left on device under "), line
    assert f"the last complete checkpoint {root / 'global_step_2'} is intact" in line
    assert line.endswith("resume with trainer.resume_mode=auto")
    assert sorted(p.name for p in root.iterdir() if p.name.startswith("global_step")) == ["global_step_2"]  # no partial
    assert is_complete(root / "global_step_2") and (root / LATEST).read_text().strip() == "2"
    assert (root / "global_step_2" / "model.bin").read_bytes() == bytes([2]) * (1 << 20)


@pytest.mark.parametrize("where", ["model shard", "trainer_state.pt", "worker shard"])
def test_disk_full_mid_checkpoint_keeps_the_previous_one_and_resumes(where, tmp_path, plain_config, monkeypatch):
    root = tmp_path / "ckpt"
    budget = (1 << 20) + SHARD * 4  # step 2's model fits, step 4's stops after four chunks
    disk = Disk(budget if where == "model shard" else None)
    trainer = ShardTrainer(root, disk)
    if where == "trainer_state.pt":
        real_save = torch.save

        def save(obj, path, *args, **kwargs):
            if "global_step_4" in str(path):
                Path(path).write_bytes(b"\0" * 100)  # a torn file, then the disk is full
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
            return real_save(obj, path, *args, **kwargs)

        monkeypatch.setattr(torch, "save", save)
    if where == "worker shard":
        from rlkit.controller.futures import WorkerError

        real_state = trainer.save_state

        def save_state(folder: Path) -> None:
            real_state(folder)
            if "global_step_4" in folder.name:
                raise WorkerError("actor_rollout_ref", 0, "save_checkpoint", "Traceback (most recent call last):\n"
                                  f"OSError: [Errno 28] No space left on device: '{folder}/actor/__0_0.distcp'")

        monkeypatch.setattr(trainer, "save_state", save_state)
    with pytest.raises(CheckpointError) as info:
        trainer.fit()
    _check_full_disk_stop(root, info.value)
    assert trainer.tracker.rows == [1, 2, 3, 4]  # step 4's row was logged before its save failed
    monkeypatch.undo()
    monkeypatch.setattr(trainer_base, "_plain", lambda cfg: {"trainer": vars(cfg.trainer)})
    again = ShardTrainer(root, Disk(), resume="auto", tracker=trainer.tracker)  # space freed: resume
    again.fit()
    assert again.tracker.rows == [1, 2, 3, 4, 5, 6]  # steps 3 and 4 rewound and run again: each once
    assert [s for s, _ in list_checkpoints(root)] == [4, 6]


# ------------------------------------------------------------------------------ --debug nan at a terminal
PLUGIN = "tests.trainer.nan_adv_plugin"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\r")


class Terminal:
    """`rlkit ARGV` on a pseudo-terminal (stdin a tty, as a user's shell), in its own session."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        master, slave = os.openpty()
        self.proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=Path.cwd(),
                                     start_new_session=True)
        os.close(slave)
        self.fd, self.text = master, ""

    def _read(self, timeout: float) -> None:
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if ready:
            try:
                self.text += ANSI.sub("", os.read(self.fd, 65536).decode(errors="replace"))
            except OSError:  # the child closed the terminal
                time.sleep(timeout)

    def expect(self, pattern: str, timeout: float) -> re.Match:
        deadline = time.monotonic() + timeout
        start = len(self.text)
        while time.monotonic() < deadline:
            found = re.search(pattern, self.text[max(0, start - 200):])
            if found:
                return found
            if self.proc.poll() is not None:
                self._read(0.5)
                found = re.search(pattern, self.text[max(0, start - 200):])
                if found:
                    return found
                break
            self._read(1.0)
        raise AssertionError(f"{pattern!r} not seen (exit {self.proc.poll()}); output:\n{self.text[-4000:]}")

    def send(self, line: str) -> None:
        os.write(self.fd, (line + "\n").encode())

    def wait(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            self._read(0.5)
        self._read(0.5)
        return self.proc.wait(timeout=5)

    def kill_session(self) -> None:
        """SIGKILL whatever is left of the run's session (Ray's processes after a killed driver)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait(timeout=30)
        os.close(self.fd)


def _run_steps(log_dir: Path) -> list[int]:
    return [int(r["step"]) for r in read_metrics(log_dir) if "critic/score/mean" in r]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_nan_pause_at_a_terminal_driver_killed_mid_step_and_resumed(toy_data, tiny_model, tmp_path):
    ckpt, logs = tmp_path / "ckpt", tmp_path / "logs"
    args = toy_overrides(toy_data, tiny_model, tmp_path, trainer__save_freq=2, trainer__total_training_steps=6,
                         algorithm__adv_estimator="test_grpo_nan_at_step", trainer__plugins=f"[{PLUGIN}]",
                         trainer__resume_mode="auto")
    cmd = rlkit_cmd("train", "grpo", "--debug", "nan", *args, "--num-cpus", "2")
    env = {**cli_env(), "RAY_ADDRESS": "local", "RLKIT_PROGRESS_EVERY_S": "0"}

    # 1. a NaN advantage at step 4 pauses the driver in pdb at the terminal; look around, then SIGKILL the driver
    term = Terminal(cmd, {**env, "RLKIT_TEST_NAN_STEP": "4"})
    try:
        term.expect(r"non-finite advantage .* at step 4.*paused for the debugger", 400)
        term.expect(r"\(Pdb\)", 60)
        term.send("p what, len(rows)")
        term.expect(r"\('advantage', 128\)", 60)  # 16 prompts x n=8, the step's rows
        term.send("p ids[:2]")
        term.expect(r"\[[^\]]+\]", 60)
        os.kill(term.proc.pid, signal.SIGKILL)  # the driver, mid-step 4 (its rows computed, nothing updated)
        assert term.proc.wait(timeout=60) == -signal.SIGKILL
    finally:
        term.kill_session()
    assert [s for s, _ in list_checkpoints(ckpt)] == [2]
    assert _run_steps(logs) == [1, 2, 3]  # step 3 logged, never checkpointed

    # 2. resume_mode=auto: from step 2, step 3's old row dropped and written again; `c` at the next NaN stops the run
    term = Terminal(cmd, {**env, "RLKIT_TEST_NAN_STEP": "5"})
    try:
        term.expect(r"resuming from \S*global_step_2", 400)
        term.expect(r"non-finite advantage .* at step 5.*paused for the debugger", 400)
        term.expect(r"\(Pdb\)", 60)
        term.send("c")
        code = term.wait(300)
    finally:
        term.kill_session()
    assert code == 1, term.text[-4000:]
    last = term.text.strip().splitlines()[-1]
    assert last.startswith("non-finite advantage") and "at step 5" in last, term.text[-3000:]
    assert last.endswith(f"replay the step with: rlkit debug replay {ckpt} --step 5"), last
    assert "Traceback" not in term.text
    assert _run_steps(logs) == [1, 2, 3, 4]  # each step once: the resumed run rewrote what followed step 2
    assert [s for s, _ in list_checkpoints(ckpt)] == [2, 4]
    rows = [json.loads(x) for x in (logs / "metrics.jsonl").read_text().splitlines() if x.strip()]
    assert len(rows) == len({r["step"] for r in rows})
