"""`rlkit train` end to end in a subprocess, with real Ray and real debugpy, on the toy task and a tiny model.

- `--debug` + `trainer.debug.break_at`: the actor pauses in update_policy, `rlkit debug list` finds it
  (on the local Ray the run started itself), `rlkit debug stacks` shows it and the driver waiting for it, our DAP
  client inspects it, detaches, and training finishes;
- `--debug post-mortem`: a worker that raises pauses; attach shows the exception; detach -> exit 1 with
  the rank and the traceback;
- no `--debug`: a stray `breakpoint()` in a worker is skipped with a warning; the run finishes.

Each run starts its own local Ray (RAY_ADDRESS=local: never join another cluster on a shared machine)
and records it next to a private state file (`cluster.runs/<pid>.json`), which is how `rlkit debug list`
finds it. tests/debug/test_cluster_flow.py runs the flow with `rlkit cluster up` instead.
"""

from __future__ import annotations

import json
import time

import psutil
import pytest
from typer.testing import CliRunner

from rlkit.controller import cluster as cl
from rlkit.debug.session import DebugSession
from rlkit_cli.main import app
from tests.debug._runs import ACTOR_PY, Run, Toy, line_after
from tests.debug._sockets import listening

pytestmark = pytest.mark.slow


def wait_paused(run: Run, toy: Toy, timeout: float = 240.0) -> dict:
    """Poll `rlkit debug list --json` (as a user would) until the run's worker shows as paused."""
    runner = CliRunner()
    deadline = time.monotonic() + timeout
    recorded = False
    while time.monotonic() < deadline:
        assert run.proc.poll() is None, f"the run ended before pausing:\n{run.output[-4000:]}"
        recorded = recorded or bool(cl.running_runs())
        if recorded:  # before the run records its private cluster, `list` could find someone else's
            listed = runner.invoke(app, ["debug", "list", "--json"])
            assert listed.exit_code == 0, listed.output
            workers = json.loads(listed.output)
            if workers:
                assert len(workers) == 1, workers
                return workers[0]
        time.sleep(0.2)
    run.stop()
    raise AssertionError(f"no paused worker within {timeout:.0f}s:\n{run.output[-4000:]}")


def check_stacks(run: Run) -> None:
    """`rlkit debug stacks` on the paused run: the worker's frame in update_actor (the update_policy phase), paused,
    and the driver waiting for its result."""
    res = CliRunner().invoke(app, ["debug", "stacks", "--run", str(run.proc.pid), "--json"])
    assert res.exit_code == 0, res.output
    driver, *workers = json.loads(res.output)
    assert driver["label"] == "driver" and driver["pid"] == run.proc.pid
    assert driver["phase"].startswith("RLTrainer.train_step")  # the step, waiting on the workers' results
    assert any(f.startswith("get_with_rank") for f in driver["frames"])
    assert len(workers) == 1 and workers[0]["label"].startswith("actor+rollout rank 0"), workers
    assert workers[0]["paused"] and workers[0]["phase"].startswith("ActorWorker.update_actor (rlkit/workers/actor.py:")
    assert any(f.startswith("maybe_break (rlkit/debug/breakpoints.py") for f in workers[0]["frames"])
    text = CliRunner().invoke(app, ["debug", "stacks", "--run", str(run.proc.pid)]).output
    assert "2 distinct stack(s)" in text and "[paused in the debugger]" in text, text


def test_train_debug_break_at_phase_list_attach_detach(toy):
    run = Run.start(toy, ["grpo", "--debug", *toy.args("ckpt_debug", steps=2),
                          "trainer.debug.break_at=[actor.update_policy:step=2]"])  # fmt: skip
    try:
        worker = wait_paused(run, toy)
        t_listed = time.time()
        runs = cl.running_runs()
        assert len(runs) == 1 and runs[0].driver_pid == run.proc.pid  # the run's own local Ray, with a dashboard
        assert cl.load_state() is None  # recorded apart: never in the file of `rlkit cluster up`
        assert worker["ip"] == "127.0.0.1" and runs[0].loopback  # single node: debugpy on loopback
        ray_pids = [run.proc.pid] + [c.pid for c in psutil.Process(run.proc.pid).children(recursive=True)]
        socks = listening(ray_pids) + listening(None, port=worker["port"])  # + debugpy's adapter (a daemon)
        assert len(socks) > 5 and not [str(s) for s in socks if not s.loopback], "\n".join(map(str, socks))
        assert worker["rank"] == 0 and worker["actor_name"].endswith(":0")
        assert "update_actor" in worker["where"] and "actor.py" in worker["where"]
        check_stacks(run)

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
            assert step == "2"  # the step the driver's call carried
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
