"""End to end with a real Ray head and real debugpy: pause -> list -> attach -> inspect -> detach.

Tests run in file order and share one cluster; the last one stops it through the CLI.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from rlkit.controller import cluster as cl
from rlkit.controller.processes import cluster_processes, free_port
from rlkit.debug.session import DebugSession
from rlkit_cli.main import app
from tests.debug import _targets

pytestmark = pytest.mark.slow
TIMINGS: dict[str, float] = {}


def flat(text: str) -> str:
    """CLI output with rich's line wrapping undone."""
    return " ".join(text.split())


def wait_paused(runner, predicate=lambda w: True, timeout: float = 30.0) -> tuple[dict, float]:
    """Poll `rlkit debug list --json` until a paused worker matching `predicate` shows; (record, seconds)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        result = runner.invoke(app, ["debug", "list", "--json"])
        assert result.exit_code == 0, result.output
        found = [w for w in json.loads(result.output) if predicate(w)]
        if found:
            return found[0], time.monotonic() - t0
        time.sleep(0.2)
    raise AssertionError(f"no paused worker within {timeout}s")


def wait_released(runner, worker_id: str, timeout: float = 20.0) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        result = runner.invoke(app, ["debug", "list", "--json", "--no-where"])
        if worker_id not in {w["worker_id"] for w in json.loads(result.output)}:
            return
        time.sleep(0.2)
    raise AssertionError("the worker still shows as paused after detach")


def test_cluster_up_said_what_to_do_next(cluster):
    out = flat(cluster.up_output)
    assert cluster.info.dashboard_url == f"http://127.0.0.1:{cluster.dashboard_port}"
    assert cluster.info.address == f"127.0.0.1:{cluster.port}" and cluster.info.loopback
    assert "RAY_AUTH_MODE=disabled" in out
    assert "Add Cluster" in out and f"127.0.0.1:{cluster.dashboard_port}" in out
    assert "rlkit train grpo ... (joins this cluster; add --debug to debug workers)" in out
    assert "--address" not in out  # the run finds the cluster itself
    assert "listening on loopback only" in out and "warning" not in out


def test_cluster_up_listens_on_loopback_only(cluster):
    """Every socket a process of the cluster listens on (read from /proc/net) is on 127.0.0.1."""
    from tests.debug._sockets import listening

    pids = [p.pid for p in cluster_processes(cluster.temp_dir, cluster.port)]
    socks = listening(pids)
    services = {s.process for s in socks}
    assert any("gcs_server" in s for s in services) and any("raylet" in s for s in services)
    assert any(s.port == cluster.port for s in socks) and any(s.port == cluster.dashboard_port for s in socks)
    assert any("ray.util.client.server" in s for s in services)  # found, and stopped at the end, through the port
    exposed = [str(s) for s in socks if not s.loopback]
    assert not exposed, "Ray services listening beyond loopback:\n" + "\n".join(exposed)
    print("\nlistening after `rlkit cluster up`:\n  " + "\n  ".join(map(str, socks)))


def test_cluster_up_twice_or_on_a_taken_port_fails(cluster, runner, tmp_path, monkeypatch):
    ports = ["--port", str(free_port()), "--dashboard-port", str(free_port())]
    again = runner.invoke(app, ["cluster", "up", *ports])
    assert again.exit_code == 1
    assert "already running" in flat(again.output)
    # Forget our cluster: the GCS port itself is now the obstacle.
    monkeypatch.setenv(cl.STATE_ENV, str(tmp_path / "other.json"))
    taken = runner.invoke(app, ["cluster", "up", "--port", str(cluster.port), "--dashboard-port", str(free_port())])
    assert taken.exit_code == 1
    assert f"port {cluster.port} is already in use" in flat(taken.output)


def test_breakpoint_list_attach_inspect_step_detach(driver, runner, cluster):
    policy = _targets.Policy.options(name="policy_rank0").remote()
    driver.get(policy.rank.remote())  # actor is up; time only the breakpoint path
    t_hit = time.monotonic()
    ref = policy.work.remote(6)
    record, _ = wait_paused(runner, lambda w: w["task"].endswith("work"))
    TIMINGS["hit->listed"] = time.monotonic() - t_hit
    assert record["actor_name"] == "policy_rank0" and record["rank"] == 0
    assert record["actor_class"] == "Policy"
    assert "work" in record["where"] and "_targets.py" in record["where"]

    t0 = time.monotonic()
    session = DebugSession.attach(record["ip"], record["port"])
    TIMINGS["listed->attached"] = time.monotonic() - t0
    try:
        frames = session.stack()
        top = frames[0]
        assert top.name == "work"
        assert top.path.endswith("_targets.py") and top.line == _targets.line_of("BP-work")
        local_vars = {v.name: v.value for v in session.locals(top.id)}
        assert local_vars["secret"] == "42" and local_vars["x"] == "6"
        assert session.evaluate("secret * 2 + x", top.id).value == "90"
        assert "BP-work" in session.source_lines(top)[top.line - 1]
        stop = session.step("next")
        assert stop.reason == "step"
        assert session.stack()[0].line == _targets.line_of("BP-work") + 1
    finally:
        session.detach()
    assert driver.get(ref, timeout=30) == 43
    wait_released(runner, record["worker_id"])
    print(f"\nbreakpoint hit -> visible in `rlkit debug list`: {TIMINGS['hit->listed']:.2f}s;"
          f" -> attached: {TIMINGS['listed->attached']:.2f}s")  # fmt: skip


def test_terminal_repl_via_cli(driver, runner):
    policy = _targets.Policy.options(name="policy_rank0_repl").remote()
    ref = policy.work.remote(1)
    wait_paused(runner, lambda w: w["actor_name"] == "policy_rank0_repl")
    commands = "bt\np secret\nsecret + 1\nlocals\nn\nl\nup\ndown\nbogus_name\nq\n"
    result = runner.invoke(app, ["debug", "attach", "--wait", "10"], input=commands)
    assert result.exit_code == 0, result.output
    out = result.output
    assert "attached in" in out and "stopped (breakpoint)" in out
    assert "work at" in out and "_targets.py" in out
    assert "(rlkit-debug) 7\n" in out and "(rlkit-debug) 8\n" in out  # p secret; secret + 1
    assert "secret (int) = 7" in out
    assert "stopped (step)" in out
    assert "NameError" in out  # a bad expression is reported, the loop goes on
    assert "detached; the worker continues" in out
    assert driver.get(ref, timeout=30) == 8


def test_targeted_breakpoint_pauses_only_the_chosen_rank(driver, runner):
    def actor(rank: int, name: str):
        return _targets.Policy.options(name=name, runtime_env={"env_vars": {"RANK": str(rank)}}).remote()

    rank1 = actor(1, "learner_one")
    assert driver.get(rank1.rank.remote()) == "1"
    t0 = time.monotonic()
    assert driver.get(rank1.targeted.remote(1), timeout=30) == 202  # rank 1: no pause
    assert time.monotonic() - t0 < 20  # generous: CI machines are shared

    rank0 = actor(0, "learner_zero")
    ref = rank0.targeted.remote(2)
    record, _ = wait_paused(runner, lambda w: w["actor_name"] == "learner_zero")
    assert record["rank"] == 0  # from the actor's runtime_env RANK
    session = DebugSession.attach(record["ip"], record["port"])
    try:
        top = session.stack()[0]
        assert top.name == "targeted"  # the user's frame, not the helper's
        assert top.line == _targets.line_of("BP-targeted")
        assert session.evaluate("local_value", top.id).value == "102"
    finally:
        session.detach()
    assert driver.get(ref, timeout=30) == 204


def test_configured_phase_break(driver, runner):
    env = {"env_vars": {"RLKIT_BREAK_AT": "actor.update_*:step=3", "RANK": "0"}}
    policy = _targets.Policy.options(name="phase_actor", runtime_env=env).remote()
    ref = policy.phase.remote(10)
    record, _ = wait_paused(runner, lambda w: w["actor_name"] == "phase_actor")
    session = DebugSession.attach(record["ip"], record["port"])
    try:
        top = session.stack()[0]
        assert (top.name, top.line) == ("phase", _targets.line_of("BP-phase"))
        assert session.evaluate("value", top.id).value == "9"
    finally:
        session.detach()
    assert driver.get(ref, timeout=30) == 10


def test_post_mortem_pauses_on_uncaught_exception(driver, runner):
    from rlkit.debug import debug_runtime_env

    ref = _targets.score.options(runtime_env=debug_runtime_env("post-mortem")).remote(3)
    record, _ = wait_paused(runner, lambda w: w["task"] == "score")
    assert "post-mortem" in record["where"]
    session = DebugSession.attach(record["ip"], record["port"])
    try:
        assert session.stop is not None and session.stop.is_exception
        assert "reward exploded on sample 3" in session.stop.description
        info = session.exception_info()
        assert info is not None and "reward exploded on sample 3" in info["details"]["message"]
        assert "ValueError" in info["details"]["typeName"]
        top = session.stack()[0]
        assert top.name == "score"
        assert session.evaluate("partial", top.id).value == "1.5"
    finally:
        session.detach()
    with pytest.raises(driver.exceptions.RayTaskError, match="reward exploded on sample 3"):
        driver.get(ref, timeout=30)


NO_DEBUG_DRIVER = textwrap.dedent(
    """
    import sys, time
    import cloudpickle, ray
    import rlkit.debug
    from rlkit.debug import debug_runtime_env, restore_driver_breakpoint
    from tests.debug import _targets

    cloudpickle.register_pickle_by_value(_targets)
    ray.init(address=sys.argv[1], runtime_env=debug_runtime_env(None))
    t0 = time.monotonic()
    print("stray ->", ray.get([_targets.stray.remote(i) for i in range(2)], timeout=60), flush=True)
    print(f"took {time.monotonic() - t0:.1f}s", flush=True)
    restore_driver_breakpoint()
    here = "driver frame"
    rlkit.debug.breakpoint()  # the driver's own breakpoint opens pdb (stdin says: p here, c)
    print("driver done", flush=True)
    """
)


def test_no_debug_mode_stray_breakpoint_does_not_hang(cluster):
    from pathlib import Path

    repo = str(Path(__file__).resolve().parents[2])
    from rlkit.debug.listeners import LOOPBACK_ENV

    proc = subprocess.run(
        [sys.executable, "-c", NO_DEBUG_DRIVER, cluster.info.address],
        env={**os.environ, **LOOPBACK_ENV},  # as `rlkit cluster up` tells plain Ray scripts
        input="p here\nc\n",
        capture_output=True,
        text=True,
        timeout=120,
        cwd=repo,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "stray -> [1, 2]" in out
    assert "breakpoint() ignored in a Ray worker" in out  # warned, once per worker process
    assert "(Pdb)" in out and "'driver frame'" in out and "driver done" in out


def test_cluster_status_then_down(cluster, runner, driver):
    status = runner.invoke(app, ["cluster", "status"])
    assert status.exit_code == 0, status.output
    for text in ("Nodes", "Resources", "Running jobs", cluster.info.dashboard_url, "paused debug workers: none"):
        assert text in flat(status.output)
    assert cluster.info.address.split(":")[0] in status.output

    driver.shutdown()
    down = runner.invoke(app, ["cluster", "down"])
    assert down.exit_code == 0, down.output
    assert "stopped" in flat(down.output)
    assert cluster_processes(cluster.temp_dir, cluster.port) == []
    assert cl.load_state() is None

    again = runner.invoke(app, ["cluster", "down"])
    assert again.exit_code == 0 and "nothing to stop" in flat(again.output)
    gone = runner.invoke(app, ["cluster", "status", "--dashboard", cluster.info.dashboard_url])
    assert gone.exit_code == 1 and "cannot reach" in flat(gone.output)
