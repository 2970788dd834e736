"""`rlkit train` as a subprocess on the toy task with a tiny model: shared by the end-to-end debug tests."""

from __future__ import annotations

import datetime as dt
import os
import re
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

from rlkit.controller import cluster as cl

REPO = Path(__file__).resolve().parents[2]
RLKIT = str(Path(sys.executable).parent / "rlkit")
ACTOR_PY = REPO / "rlkit" / "workers" / "actor.py"
PAUSED_AT = re.compile(
    r"pausing at phase '(?P<phase>[^']+)' \(rank (?P<rank>\d+), step (?P<step>\d+)\) at (?P<at>[\d:.]+)"
)


@dataclass
class Toy:
    root: Path
    state_file: Path

    def args(self, name: str, steps: int) -> list[str]:
        return [
            f"data.train_files={self.root}/train.parquet", f"data.val_files={self.root}/test.parquet",
            f"actor_rollout_ref.model.path={self.root}/model", "actor_rollout_ref.rollout.name=hf",
            "data.max_prompt_length=32", "data.max_response_length=3", "data.train_batch_size=8",
            "actor_rollout_ref.actor.ppo_mini_batch_size=8", "actor_rollout_ref.rollout.n=4",
            f"trainer.total_training_steps={steps}", "trainer.n_gpus_per_node=1",
            f"trainer.default_local_dir={self.root}/{name}", "trainer.logger=[file]",
        ]  # fmt: skip


@dataclass
class Run:
    """A `rlkit train` subprocess; a reader thread keeps its merged output."""

    proc: subprocess.Popen
    lines: list[str] = field(default_factory=list)

    @classmethod
    def start(cls, toy: Toy, argv: list[str], **env: str) -> Run:
        """`rlkit train ARGV` on a private local Ray (RAY_ADDRESS=local), recorded beside toy.state_file."""
        full_env = {**os.environ, cl.STATE_ENV: str(toy.state_file), "RAY_ADDRESS": "local", **env}
        full_env.pop("RLKIT_DASHBOARD", None)
        toy.state_file.unlink(missing_ok=True)
        return cls.launch(["train", *argv], full_env)

    @classmethod
    def launch(cls, argv: list[str], env: dict[str, str]) -> Run:
        """`rlkit ARGV` with exactly `env`, in its own session so stop() reaches its children."""
        proc = subprocess.Popen(
            [RLKIT, *argv], cwd=REPO, env=env, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )  # fmt: skip
        run = cls(proc)
        threading.Thread(target=run._read, daemon=True).start()
        return run

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise AssertionError(f"`rlkit train` still running after {timeout:.0f}s:\n{self.output[-4000:]}") from None

    def stop(self) -> None:
        """Stop the run and the Ray processes it started (its descendants, found by pid)."""
        import psutil

        if self.proc.poll() is not None:
            return
        try:
            children = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.Error:
            children = []
        self.proc.send_signal(signal.SIGINT)  # ray.shutdown() on the way out
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        for child in children:
            try:
                child.kill()
            except psutil.Error:
                pass

    def pause_time(self) -> float:
        """Epoch seconds of the worker's "pausing at phase ... at HH:MM:SS.mmm" line."""
        found = [m for m in map(PAUSED_AT.search, self.lines) if m]
        assert found, f"no pause line in the output:\n{self.output[-3000:]}"
        clock = dt.datetime.strptime(found[-1]["at"], "%H:%M:%S.%f").time()
        now = dt.datetime.now()
        days = (now.date() - dt.timedelta(days=d) for d in (0, 1))  # the pause may predate midnight
        return min(
            (dt.datetime.combine(d, clock) for d in days), key=lambda t: abs((now - t).total_seconds())
        ).timestamp()


def line_after(path: Path, text: str) -> int:
    """1-based number of the line after the one containing `text` (where a phase break stops)."""
    lines = path.read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line) + 1
