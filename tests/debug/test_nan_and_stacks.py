"""`rlkit debug stacks` on a paused run and `--debug nan` on a run whose gradient turns NaN on one rank: real
`rlkit train` subprocesses on the toy task (each on its own local Ray), as a user runs them.

- a run paused by `trainer.debug.break_at=actor.update_policy` (tests/debug/_runs.py): `rlkit debug stacks` shows
  the worker's frame in update_actor (the update_policy phase), marked paused, and the driver waiting for it;
- `--debug nan` with a plugin loss (tests/debug/nan_plugin.py) whose gradient is NaN at step 3 on rank 1 of 2: the
  run stops at step 3 with one line naming the gradient's parameter and rank 1, the micro-batch file and the
  replay command, and logs no step after 2.
"""

from __future__ import annotations

import json
import time

import pytest
import torch
from typer.testing import CliRunner

from rlkit_cli.main import app
from tests.debug._runs import Run
from tests.debug.nan_plugin import LOSS, RANK, STEP

pytestmark = pytest.mark.slow


def test_stacks_show_the_paused_worker_in_update_policy_and_the_driver_waiting(toy):
    run = Run.start(toy, ["grpo", "--debug", *toy.args("ckpt_stacks", steps=2), "trainer.val_before_train=false",
                          "trainer.debug.break_at=[actor.update_policy:step=1]"])  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while not any("pausing at phase 'actor.update_policy'" in line for line in run.lines):
            assert run.proc.poll() is None and time.monotonic() < deadline, run.output[-3000:]
            time.sleep(0.3)
        while True:  # the pause line comes a moment before debugpy waits for a client
            res = CliRunner().invoke(app, ["debug", "stacks", "--run", str(run.proc.pid), "--json"])
            assert res.exit_code == 0, res.output
            procs = json.loads(res.output)
            if procs[-1]["paused"] or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        driver, workers = procs[0], procs[1:]
        assert driver["label"] == "driver" and driver["pid"] == run.proc.pid
        assert driver["phase"].startswith("RLTrainer.train_step")  # the step, waiting on the workers' results
        assert any(f.startswith("get_with_rank") for f in driver["frames"])
        assert len(workers) == 1 and workers[0]["rank"] == 0 and workers[0]["label"].startswith("actor+rollout rank 0")
        worker = workers[0]
        assert worker["paused"] and worker["phase"].startswith("ActorWorker.update_actor (rlkit/workers/actor.py:")
        assert any(f.startswith("maybe_break (rlkit/debug/breakpoints.py") for f in worker["frames"])
        text = CliRunner().invoke(app, ["debug", "stacks"]).output  # the only run on this node: no --run needed
        assert "2 distinct stack(s)" in text and "[paused in the debugger]" in text, text
    finally:
        run.stop()


def test_debug_nan_stops_at_the_first_nan_gradient_naming_parameter_and_rank(toy):
    args = [*toy.args("ckpt_nan", steps=5), "trainer.n_gpus_per_node=2", "trainer.val_before_train=false",
            "trainer.plugins=[tests.debug.nan_plugin]", f"actor_rollout_ref.actor.policy_loss={LOSS}"]
    run = Run.start(toy, ["grpo", "--debug", "nan", *args])
    try:
        assert run.wait(300) == 1, run.output[-4000:]
    finally:
        run.stop()
    last = run.output.strip().splitlines()[-1]
    assert last.startswith("non-finite gradient actor of model.") and f"at step {STEP}, rank {RANK};" in last, last
    saved = toy.root / "ckpt_nan" / "logs" / "anomalies" / f"step{STEP}_rank{RANK}_gradient.pt"
    assert f"saved to {saved}" in last and saved.is_file()
    assert last.endswith(f"replay the step with: rlkit debug replay {toy.root / 'ckpt_nan'} --step {STEP}")
    rows = torch.load(saved, weights_only=False)  # the micro-batch, with its sample ids
    assert len(rows) > 0 and "uid" in rows.non_tensors and "responses" in rows.tensors
    assert "Traceback" not in run.output
    steps = [json.loads(line)["step"] for line in (toy.root / "ckpt_nan" / "logs" / "metrics.jsonl").open()]
    assert steps == list(range(1, STEP))  # the steps before the NaN, none after
