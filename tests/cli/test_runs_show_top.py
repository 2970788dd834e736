"""`rlkit runs`, `rlkit show` and `rlkit top` over real toy runs: one `rlkit train` run that `rlkit top` watches in a
pseudo-terminal (tmux, 80x24) while it trains and that then finishes, a run stopped by a reward function that fails on
every sample, and a run stopped by a real SIGINT in its second step (the last two in this process, on a shared Ray).

One module fixture makes the three runs and drives `top` while the first one trains, so the tests do not depend on
their order (the suite shuffles them).
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from rlkit.runs.status import read_status
from rlkit.trainer.run.interrupt import InterruptWatch
from tests.trainer.conftest import (
    REPO,
    cli_env,
    ensure_ray,
    fit,
    rlkit_cmd,
    run_cli,
    tiny_model,
    toy_data,
    toy_overrides,
)

__all__ = ["tiny_model", "toy_data"]  # the session fixtures, used here too

STEPS = 16
# a reward that takes a little time per sample, so that a step lasts long enough for `top` to see the steps advance
SLOW_REWARD = '''
import time


def compute_score(solution_str, ground_truth):
    time.sleep(0.006)
    return 1.0 if solution_str.strip().startswith(str(ground_truth)) else 0.0
'''
BROKEN_REWARD = "def compute_score(solution_str, ground_truth):\n    return 1 / 0\n"
# a user's Ctrl-C, from inside the run: SIGINT to this process in the second step's scoring
CTRL_C_REWARD = '''
import os
import signal

CALLS = [0]


def compute_score(solution_str, ground_truth):
    CALLS[0] += 1
    if CALLS[0] == 160:  # 128 samples a step: in step 2
        os.kill(os.getpid(), signal.SIGINT)
    return 0.0
'''


def _wait(predicate, timeout: float, what: str, poll: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


class Tmux:
    """A private tmux server (its own socket) running one command in an 80x24 window."""

    def __init__(self, command: str) -> None:
        self.socket = f"rlkit-test-{uuid.uuid4().hex[:8]}"
        self._tmux("new-session", "-d", "-s", "top", "-x", "80", "-y", "24", command)

    def _tmux(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True, check=True,
                              timeout=30).stdout

    def screen(self) -> str:
        return self._tmux("capture-pane", "-p", "-t", "top")

    def keys(self, *keys: str) -> None:
        self._tmux("send-keys", "-t", "top", *keys)

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=30)


def _header_step(screen: str) -> int | None:
    match = re.search(r"step (\d+)/(\d+)", screen)
    return int(match.group(1)) if match else None


def _watch_with_top(folder: Path) -> dict:
    """`rlkit top FOLDER` in an 80x24 pseudo-terminal while the run trains: the screens, the steps it showed, the
    refresh times it reported, and its exit status after `q`."""
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in cli_env().items() if k in ("PYTHONPATH", "RAY_AUTH_MODE"))
    top = shlex.join(rlkit_cmd("top", str(folder), "--refresh", "0.5"))
    tmux = Tmux(f"cd {shlex.quote(str(REPO))} && env {env} {top}; echo TOP-EXIT=$?; sleep 600")
    seen: dict = {"screens": [], "steps": [], "refresh_ms": []}
    try:
        def step_shown() -> bool:
            screen = tmux.screen()
            step = _header_step(screen)
            if step is not None and "rlkit:0" in screen:
                seen["screens"].append(screen)
                seen["steps"].append(step)
                seen["refresh_ms"] += [float(x) for x in re.findall(r"refresh (\d+)ms", screen)]
            return len(set(seen["steps"])) >= 2  # the step advanced on screen

        _wait(step_shown, 120, "rlkit top to show the step advance", poll=0.5)
        tmux.keys("2")  # the reward curve pane
        seen["curve"] = _wait(lambda: next((s for s in [tmux.screen()] if "reward so far" in s), None), 30,
                              "the curve pane")
        tmux.keys("q")
        seen["exit"] = _wait(lambda: re.search(r"TOP-EXIT=(\d+)", tmux.screen()), 30, "rlkit top to exit").group(1)
        seen["status_after_q"] = read_status(folder)
    finally:
        tmux.close()
    return seen


def _scrape(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


def _start_ray() -> None:
    """This process's local Ray for the two in-process runs. On a machine loaded by other jobs, Ray's own 30 s limit
    for its raylet to come up can pass (`The current node timed out during startup`): that is not what these tests
    are about, so a second start is allowed."""
    import ray

    try:
        ensure_ray()
    except Exception as exc:
        if "timed out during startup" not in str(exc):
            raise
        ray.shutdown()
        ensure_ray()


def _in_process_run(toy_data: Path, tiny_model: Path, out: Path, reward: str) -> BaseException:
    """A toy GRPO run in this process (the shared local Ray) with `reward` as its custom reward; returns what stopped
    it."""
    reward_file = out / "reward.py"
    out.mkdir(parents=True)
    reward_file.write_text(reward)
    overrides = toy_overrides(toy_data, tiny_model, out, trainer__total_training_steps=4,
                              trainer__default_local_dir=out, trainer__log_dir=out / "logs",
                              custom_reward_function__path=reward_file)
    try:
        with InterruptWatch():  # as `rlkit train` runs: a SIGINT raises KeyboardInterrupt in the driver's thread
            fit("grpo", overrides, out / "logs")
    except BaseException as exc:  # the SIGINT's KeyboardInterrupt too: this run was meant to stop
        return exc
    raise AssertionError(f"the run in {out} was expected to stop, and finished")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, toy_data, tiny_model) -> dict:
    if shutil.which("tmux") is None:
        pytest.fail("tmux is not installed: scripts/setup.sh installs it (apt-get install -y tmux)")
    root = tmp_path_factory.mktemp("runs")
    finished = root / "finished"
    finished.mkdir()
    (root / "slow_reward.py").write_text(SLOW_REWARD)
    args = toy_overrides(toy_data, tiny_model, root, trainer__total_training_steps=STEPS,
                         trainer__default_local_dir=finished, trainer__log_dir=finished / "logs",
                         trainer__rollout_data_dir=finished / "rollouts", data__val_files=toy_data / "test.parquet",
                         trainer__val_before_train=True, custom_reward_function__path=root / "slow_reward.py",
                         trainer__prometheus__port=0)
    with open(root / "train.log", "w") as log:
        proc = subprocess.Popen(rlkit_cmd("train", "grpo", *args, "--num-cpus", "2"), stdout=log,
                                stderr=subprocess.STDOUT, env=cli_env(), cwd=REPO)
        try:
            _wait(lambda: (read_status(finished) or {}).get("step", 0) >= 1 or proc.poll() is not None, 600,
                  "the toy run's first step")
            assert proc.poll() is None, (root / "train.log").read_text()[-3000:]
            scrape = _scrape(read_status(finished)["prometheus"])
            top = _watch_with_top(finished)
            rc = proc.wait(timeout=600)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert rc == 0, (root / "train.log").read_text()[-3000:]
    _start_ray()
    failed = _in_process_run(toy_data, tiny_model, root / "failed", BROKEN_REWARD)
    interrupted = _in_process_run(toy_data, tiny_model, root / "interrupted", CTRL_C_REWARD)
    return {"root": root, "top": top, "failed_exc": failed, "interrupted_exc": interrupted, "scrape": scrape}


@pytest.mark.slow
def test_top_shows_the_step_advancing_and_the_workers_and_q_leaves_the_run_going(runs):
    top = runs["top"]
    assert top["exit"] == "0"
    assert len(set(top["steps"])) >= 2 and top["steps"] == sorted(top["steps"]), top["steps"]
    screen = top["screens"][-1]
    assert max(len(line) for line in screen.splitlines()) <= 80 and len(screen.splitlines()) <= 24
    assert "rlkit:0" in screen and "actor+rollout" in screen and "yes" in screen, screen  # the worker, alive
    assert "[running]" in screen and "phase " in screen and "eta " in screen, screen
    assert "reward so far" in top["curve"] and "step" in top["curve"], top["curve"]
    assert top["status_after_q"]["state"] == "running"  # q left it running ...
    status = read_status(runs["root"] / "finished")
    assert status["state"] == "finished" and status["step"] == STEPS  # ... to its end
    print(f"rlkit top refresh: {top['refresh_ms']} ms\n{screen}\n{top['curve']}")  # docs/watching.md's capture


@pytest.mark.slow
def test_the_run_serves_prometheus_metrics_on_loopback(runs):
    lines = runs["scrape"].splitlines()
    assert 'rlkit_state{state="running"} 1.0' in lines and f"rlkit_total_steps {float(STEPS)}" in lines, runs["scrape"]
    assert any(line.startswith("rlkit_critic_score_mean ") for line in lines), runs["scrape"]


@pytest.mark.slow
def test_runs_lists_the_finished_failed_and_interrupted_runs(runs):
    assert isinstance(runs["interrupted_exc"], KeyboardInterrupt), repr(runs["interrupted_exc"])
    assert "failed on all" in str(runs["failed_exc"]), repr(runs["failed_exc"])
    res = run_cli("runs", str(runs["root"]), "--json")
    assert res.returncode == 0, res.stderr[-2000:]
    rows = {r["name"]: r for r in json.loads(res.stdout)}
    assert {n: r["status"] for n, r in rows.items()} == {
        "finished": "finished", "failed": "failed", "interrupted": "interrupted"}
    done = rows["finished"]
    assert done["trainer"] == "grpo" and (done["step"], done["total"]) == (STEPS, STEPS)
    assert done["reward"] is not None and done["val_score"] is not None and done["precision"] == "float32"
    assert rows["interrupted"]["step"] == 1 and rows["interrupted"]["total"] == 4
    assert "ZeroDivisionError" in rows["failed"]["error"] or "failed on all" in rows["failed"]["error"]
    table = run_cli("runs", str(runs["root"]))
    assert table.returncode == 0 and all(w in table.stdout for w in ("finished", "failed", "interrupted", "grpo"))
    print(table.stdout)  # docs/watching.md's capture


@pytest.mark.slow
def test_show_plots_the_curves_with_axes_and_names_and_writes_a_png(runs, tmp_path):
    from PIL import Image

    finished = runs["root"] / "finished"
    image = tmp_path / "curves.png"
    res = run_cli("show", str(finished), "--png", str(image), "--width", "90")
    assert res.returncode == 0, res.stderr[-2000:]
    out = res.stdout
    for name in ("reward and validation score", "critic/score/mean", "val/rlkit/toy_copy/score/mean@1",
                 "response length", "response_length/mean", "memory per process", "seconds per step by phase",
                 "latest samples"):
        assert name in out, f"{name!r} not in:\n{out[-4000:]}"
    assert "┤" in out and "└┬" in out and re.search(r"^\s+step\s*$", out, re.M), out[-3000:]  # y ticks, x axis
    with Image.open(image) as img:
        assert img.format == "PNG" and img.size[0] > 600 and img.size[1] > 400
        assert len(set(img.convert("L").getdata())) > 10  # drawn, not blank
    picked = run_cli("show", str(finished), "--metric", "actor/pg_*", "--compare", str(runs["root"] / "interrupted"),
                     "--samples", "0")
    assert picked.returncode == 0, picked.stderr[-2000:]
    assert "finished: actor/pg_loss" in picked.stdout and "interrupted: actor/pg_loss" in picked.stdout
    summary = run_cli("show", str(finished), "--summary")  # what `make quickstart` ends with
    assert summary.returncode == 0 and "reward and validation score" in summary.stdout, summary.stderr[-2000:]
    assert "before / after" in summary.stdout and "critic/score/mean" in summary.stdout.split("before / after")[1]
    missing = run_cli("show", str(finished), "--metric", "nope/*")
    assert missing.returncode == 1 and "--metric nope/*: no logged metric matches" in missing.stderr
