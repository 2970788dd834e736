"""`rlkit train` end to end in a subprocess, with real Ray and real debugpy, on the toy task and a tiny model.

- `--debug` + `trainer.debug.break_at`: the actor pauses in update_policy, `rlkit debug list` finds it
  (on the local Ray the run started itself), our DAP client inspects it, detaches, and training finishes;
- `--debug post-mortem`: a worker that raises pauses; attach shows the exception; detach -> exit 1 with
  the rank and the traceback;
- no `--debug`: a stray `breakpoint()` in a worker is skipped with a warning; the run finishes.

Each run starts its own local Ray (RAY_ADDRESS=local: never join another cluster on a shared machine)
and remembers it in a private state file, which is how `rlkit debug list` finds it.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlkit.debug import cluster as cl
from rlkit.debug.session import DebugSession
from rlkit_cli.main import app

pytestmark = pytest.mark.slow
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


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory):
    from rlkit.testing import save_tiny_model

    root = tmp_path_factory.mktemp("toy")
    made = CliRunner().invoke(app, ["data", "toy", "--out", str(root), "--length", "1"])
    assert made.exit_code == 0, made.output
    save_tiny_model(str(root / "model"), tie_embeddings=True)
    mp = pytest.MonkeyPatch()
    state_file = root / "cluster.json"
    mp.setenv(cl.STATE_ENV, str(state_file))  # `rlkit debug list` in this process reads the run's record
    mp.delenv("RLKIT_DASHBOARD", raising=False)
    try:
        yield Toy(root, state_file)
    finally:
        mp.undo()


@dataclass
class Run:
    """A `rlkit train` subprocess; a reader thread keeps its merged output."""

    proc: subprocess.Popen
    lines: list[str] = field(default_factory=list)

    @classmethod
    def start(cls, toy: Toy, argv: list[str], **env: str) -> Run:
        full_env = {**os.environ, cl.STATE_ENV: str(toy.state_file), "RAY_ADDRESS": "local", **env}
        full_env.pop("RLKIT_DASHBOARD", None)
        toy.state_file.unlink(missing_ok=True)
        proc = subprocess.Popen(
            [RLKIT, "train", *argv], cwd=REPO, env=full_env, stdin=subprocess.DEVNULL,
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


def wait_paused(run: Run, toy: Toy, timeout: float = 240.0) -> dict:
    """Poll `rlkit debug list --json` (as a user would) until the run's worker shows as paused."""
    runner = CliRunner()
    deadline = time.monotonic() + timeout
    recorded = False
    while time.monotonic() < deadline:
        assert run.proc.poll() is None, f"the run ended before pausing:\n{run.output[-4000:]}"
        recorded = recorded or toy.state_file.exists()
        if recorded:  # before the run records its cluster, `list` could find someone else's
            listed = runner.invoke(app, ["debug", "list", "--json"])
            assert listed.exit_code == 0, listed.output
            workers = json.loads(listed.output)
            if workers:
                assert len(workers) == 1, workers
                return workers[0]
        time.sleep(0.2)
    run.stop()
    raise AssertionError(f"no paused worker within {timeout:.0f}s:\n{run.output[-4000:]}")


def line_after(path: Path, text: str) -> int:
    """1-based number of the line after the one containing `text` (where a phase break stops)."""
    lines = path.read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line) + 1


def test_train_debug_break_at_phase_list_attach_detach(toy):
    run = Run.start(toy, ["grpo", "--debug", *toy.args("ckpt_debug", steps=2),
                          "trainer.debug.break_at=[actor.update_policy:step=2]"])  # fmt: skip
    try:
        worker = wait_paused(run, toy)
        t_listed = time.time()
        info = cl.load_state()
        assert info is not None and info.started_by == "rlkit train"  # the run's own local Ray, with a dashboard
        assert worker["rank"] == 0 and worker["actor_name"].endswith(":0")
        assert "update_actor" in worker["where"] and "actor.py" in worker["where"]

        session = DebugSession.attach(worker["ip"], worker["port"])
        t_attached = time.time()
        try:
            top = session.stack()[0]
            assert top.name == "update_actor"
            assert top.path.endswith("rlkit/workers/actor.py")
            assert top.line == line_after(ACTOR_PY, 'maybe_break("actor.update_policy")')
            local_vars = {v.name: v for v in session.locals(top.id)}
            assert local_vars["batch"].value.startswith("Batch(len=32")  # 8 prompts x n=4
            assert session.evaluate("len(batch) * 10 + self.rank", top.id).value == "320"
            step = session.evaluate("__import__('rlkit.debug', fromlist=['x']).current_step()", top.id).value
            assert step == "2"  # set by the rollout from the driver's call_id
        finally:
            session.detach()
        rc = run.wait(timeout=180)
        out = run.output
        assert rc == 0, out[-4000:]
        assert "run summary" in out and "Debug mode 'on'" in out and "rlkit debug list" in out
        hit = run.pause_time()
        print(f"\n[rlkit train --debug] breakpoint hit -> visible in `rlkit debug list`: {t_listed - hit:.2f}s;"
              f" -> attached: {t_attached - hit:.2f}s (list -> attached {t_attached - t_listed:.2f}s)")  # fmt: skip
        assert t_listed - hit < 10, "the paused worker took too long to show in `rlkit debug list`"
    finally:
        run.stop()


def test_train_debug_post_mortem_worker_exception(toy):
    run = Run.start(toy, ["grpo", "--debug", "post-mortem", *toy.args("ckpt_pm", steps=1)],
                    RLKIT_TEST_RAISE_IN="actor.update_policy")  # fmt: skip
    try:
        worker = wait_paused(run, toy)
        assert worker["where"] == "uncaught exception (post-mortem)"
        session = DebugSession.attach(worker["ip"], worker["port"])
        try:
            assert session.stop is not None and session.stop.is_exception
            assert "injected failure in actor.update_policy on rank 0" in session.stop.description
            details = (session.exception_info() or {}).get("details", {})
            assert "RuntimeError" in details.get("typeName", "")
            frames = session.stack()
            actor = next(f for f in frames if f.name == "update_actor")  # the user's frame is on the stack
            assert session.evaluate("len(batch)", actor.id).value == "32"
        finally:
            session.detach()
        rc = run.wait(timeout=120)
        out = run.output
        assert rc == 1, out[-4000:]
        report = out[out.index("worker failure:") :]
        assert "rank 0 failed in update_actor" in report
        assert "Traceback" in report or 'File "' in report
        assert "getattr(self._roles[role], method)" in report  # the traceback is printed verbatim
        assert "RuntimeError: injected failure in actor.update_policy on rank 0" in report
    finally:
        run.stop()


def test_train_without_debug_skips_a_worker_breakpoint(toy):
    t0 = time.monotonic()
    run = Run.start(toy, ["grpo", *toy.args("ckpt_nodebug", steps=1)], RLKIT_TEST_BREAKPOINT_IN="actor.update_policy")
    try:
        rc = run.wait(timeout=180)
        out = run.output
        assert rc == 0, out[-4000:]
        assert "breakpoint() ignored in a Ray worker" in out and "run summary" in out
        assert "Ray debugger is listening" not in out
        print(f"\n[rlkit train, no --debug] finished in {time.monotonic() - t0:.0f}s past a stray breakpoint()")
    finally:
        run.stop()
