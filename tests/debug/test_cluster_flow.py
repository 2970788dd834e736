"""The design card's debug flow, exactly as a user runs it (real CLI subprocesses, real Ray, real debugpy):

    rlkit cluster up                                   # dashboard on 127.0.0.1:8265, every port on loopback
    rlkit train grpo --debug trainer.debug.break_at=... # no --address: it joins that cluster
    (the VS Code extension's dashboard query finds the paused worker; a DAP client attaches, reads, detaches)
    rlkit cluster down                                 # no Ray process, no temp dir left

It uses the default ports (GCS 6379, dashboard 8265), like the user. Tests run serially: other tests
leave 8265 free when they end (a run's private Ray takes it only while it runs), this one waits
for the ports to be free first, fails naming the holder if they stay taken, and frees them at the end.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import psutil
import pytest

from rlkit.controller import cluster as cl
from rlkit.controller.processes import cluster_processes, port_in_use, stop_processes
from rlkit.debug.listeners import SINGLE_NODE_ENV
from rlkit.debug.session import DebugSession
from tests.debug._runs import ACTOR_PY, RLKIT, Run, Toy, line_after
from tests.debug._sockets import listening

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
GCS, DASHBOARD = cl.DEFAULT_PORT, cl.DEFAULT_DASHBOARD_PORT
TEMP_DIR = cl.default_temp_dir(GCS)
# What the Ray Distributed Debugger extension asks the dashboard (rlkit.debug.state.paused_workers does the same).
EXTENSION_QUERY = "/api/v0/workers?" + urllib.parse.urlencode([
    ("detail", "1"), ("limit", "10000"),
    ("filter_keys", "num_paused_threads"), ("filter_predicates", "!="), ("filter_values", "0"),
    ("filter_keys", "is_alive"), ("filter_predicates", "="), ("filter_values", "True"),
])  # fmt: skip


@pytest.fixture
def user_env(toy: Toy, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """A user's shell: nothing exported (no RAY_ADDRESS, no RAY_AUTH_MODE), records in a private file."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RLKIT_DASHBOARD", SINGLE_NODE_ENV)}  # fmt: skip
    env[cl.STATE_ENV] = str(toy.state_file)
    monkeypatch.setenv(cl.STATE_ENV, str(toy.state_file))
    return env


def cli(env: dict[str, str], *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([RLKIT, *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout)


def flat(text: str) -> str:
    return " ".join(text.split())


def wait_ports_free(ports: tuple[int, ...], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while any(port_in_use(p) for p in ports):
        if time.monotonic() > deadline:
            holders = [f"{c.laddr.port}: pid {c.pid} {' '.join(psutil.Process(c.pid).cmdline()[:3])}"
                       for c in psutil.net_connections("tcp") if c.laddr.port in ports and c.pid]  # fmt: skip
            raise AssertionError(f"ports {ports} still taken after {timeout:.0f}s (left by another test?): {holders}")
        time.sleep(0.5)


def extension_paused(timeout: float, run: Run) -> dict:
    """Poll the dashboard at 127.0.0.1:8265 the way the extension does until one worker is paused."""
    url = f"http://127.0.0.1:{DASHBOARD}{EXTENSION_QUERY}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert run.proc.poll() is None, f"the run ended before pausing:\n{run.output[-4000:]}"
        with urllib.request.urlopen(url, timeout=10) as resp:
            rows = json.loads(resp.read())["data"]["result"]["result"]
        if rows:
            assert len(rows) == 1, rows
            return rows[0]
        time.sleep(0.3)
    raise AssertionError(f"no paused worker on the dashboard within {timeout:.0f}s:\n{run.output[-4000:]}")


def cluster_sockets() -> list:
    return listening([p.pid for p in cluster_processes(TEMP_DIR, GCS)])


def test_design_card_flow(toy: Toy, user_env: dict[str, str]):
    wait_ports_free((GCS, DASHBOARD))
    assert not cluster_processes(TEMP_DIR, GCS), f"Ray processes already use {TEMP_DIR}"
    run = private = None
    try:
        t0 = time.monotonic()
        up = cli(user_env, "cluster", "up")
        assert up.returncode == 0, up.stdout + up.stderr
        print(f"\n[cluster up] {time.monotonic() - t0:.0f}s:\n{up.stdout}")
        assert "listening on loopback only" in flat(up.stdout) and "warning" not in up.stdout
        info = cl.load_state()
        assert info is not None and info.address == f"127.0.0.1:{GCS}"
        assert info.dashboard_url == f"http://127.0.0.1:{DASHBOARD}"
        record = Path(user_env[cl.STATE_ENV]).read_bytes()
        socks = cluster_sockets()
        assert {GCS, DASHBOARD} <= {s.port for s in socks}
        assert not [str(s) for s in socks if not s.loopback], "\n".join(map(str, socks))
        print("listening after `rlkit cluster up`:\n  " + "\n  ".join(map(str, socks)))

        argv = ["train", "grpo", "--debug", *toy.args("ckpt_card", steps=2),
                "trainer.debug.break_at=actor.update_policy:step=2"]  # a scalar, as docs/debugging.md shows
        run = Run.launch(argv, user_env)
        row = extension_paused(300, run)
        t_listed = time.time()
        assert f"joining the cluster from `rlkit cluster up` at 127.0.0.1:{GCS}" in flat(run.output)
        assert row["ip"] == "127.0.0.1" and row["debugger_port"]
        socks = cluster_sockets()  # now with the run's workers (their gRPC servers) too
        assert not [str(s) for s in socks if not s.loopback], "\n".join(map(str, socks))
        debug_socks = listening(None, port=int(row["debugger_port"]))  # debugpy's adapter (a daemon of the worker)
        assert debug_socks and all(s.loopback for s in debug_socks), debug_socks
        print(f"listening while paused: {len(socks)} sockets of the cluster's processes, all on loopback;"
              f" debugpy: {', '.join(f'{s.ip}:{s.port}' for s in debug_socks)}")  # fmt: skip

        stacks = cli(user_env, "debug", "stacks", "--run", str(run.proc.pid), "--json")  # a run on `cluster up`'s Ray
        assert stacks.returncode == 0, stacks.stdout + stacks.stderr
        driver, *workers = json.loads(stacks.stdout)
        assert driver["phase"].startswith("RLTrainer.train_step") and len(workers) == 1, stacks.stdout
        assert workers[0]["paused"] and workers[0]["phase"].startswith("ActorWorker.update_actor"), stacks.stdout

        session = DebugSession.attach(row["ip"], int(row["debugger_port"]))
        t_attached = time.time()
        try:
            frames = session.stack()
            top = frames[0]
            assert (top.name, top.path.endswith("rlkit/workers/actor.py")) == ("update_actor", True)
            assert top.line == line_after(ACTOR_PY, 'maybe_break("actor.update_policy")')
            assert session.evaluate("len(batch)", top.id).value == "32"  # 8 prompts x n=4
            assert session.evaluate("__import__('rlkit.debug').debug.current_step()", top.id).value == "2"
        finally:
            session.detach()
        assert run.wait(timeout=300) == 0, run.output[-4000:]
        hit = run.pause_time()
        print(f"[train --debug, joined] breakpoint hit -> listed by the extension's query {t_listed - hit:.1f}s,"
              f" -> attached {t_attached - hit:.1f}s")  # fmt: skip
        assert "run summary" in run.output and "debugpy listens on 127.0.0.1" in run.output
        assert Path(user_env[cl.STATE_ENV]).read_bytes() == record  # the run joined; it recorded nothing

        # --address local: a private Ray beside it, recorded apart; `cluster up`'s record stays as it was.
        private = Run.launch(["train", "grpo", "--debug", "--address", "local",
                                          *toy.args("ckpt_private", steps=1)], user_env)  # fmt: skip
        seen = []
        while private.proc.poll() is None:
            seen += [r.driver_pid for r in cl.running_runs()]
            time.sleep(0.3)
        assert private.wait(timeout=10) == 0, private.output[-4000:]
        assert "joining" not in private.output and private.proc.pid in seen
        assert Path(user_env[cl.STATE_ENV]).read_bytes() == record and not cl.running_runs()

        down = cli(user_env, "cluster", "down")
        assert down.returncode == 0 and "stopped the Ray cluster at 127.0.0.1" in flat(down.stdout), down.stdout
        assert cluster_processes(TEMP_DIR, GCS) == [] and not os.path.exists(TEMP_DIR)
        leftovers = [p.pid for p in psutil.process_iter(["cmdline"]) if TEMP_DIR in " ".join(p.info["cmdline"] or [])]
        assert not leftovers, f"Ray processes left after `rlkit cluster down`: {leftovers}"
        again = cli(user_env, "cluster", "down")
        assert again.returncode == 0 and "nothing to stop" in flat(again.stdout)
        assert not os.path.exists(TEMP_DIR) and not Path(user_env[cl.STATE_ENV]).exists()
    finally:
        for r in (run, private):
            if r is not None:
                r.stop()
        stop_processes(TEMP_DIR, gcs_port=GCS)
        shutil.rmtree(TEMP_DIR, ignore_errors=True)
        wait_ports_free((GCS, DASHBOARD))  # the next test may start a Ray with the default dashboard port
