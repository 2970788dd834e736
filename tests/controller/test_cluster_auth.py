"""Token auth of a cluster on the network, as a user runs it (real CLI subprocesses, real Ray, real debugpy):

    rlkit cluster up --listen-all            # head on the network, token auth on, token file 0600, printed path
    (ray.init / job submission / dashboard without the token: refused; with it: accepted)
    rlkit cluster join HEAD --token-file F   # a worker node (here on the same machine); a wrong token: one line
    rlkit debug list/attach through a forwarded dashboard port and a forwarded debugpy port (`ssh -L` stand-ins)
    rlkit cluster down                       # the worker node and the head, nothing left

Private ports, temp dirs and records: others run Ray clusters on this machine. The unit tests at the top
need no Ray.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from rlkit.controller import cluster as cl
from rlkit.controller.processes import cluster_processes, free_ports, stop_processes
from rlkit.errors import UserError
from rlkit.utils import ray_token
from tests.controller._forward import Forward

REPO = Path(__file__).resolve().parents[2]
RLKIT = str(Path(sys.executable).parent / "rlkit")


def flat(text: str) -> str:
    return " ".join(text.split())


# -- the token file (no Ray) -------------------------------------------------------------------
def test_token_file_is_made_0600_and_read_back(tmp_path):
    path = tmp_path / "sub" / "cluster_token"
    token, created = ray_token.create_or_read(path)
    assert created and len(token) == 64 and int(token, 16) >= 0  # 256 random bits, hex
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert ray_token.create_or_read(path) == (token, False)
    assert ray_token.fingerprint(token) not in token and len(ray_token.fingerprint(token)) == 12


def test_token_file_problems_are_one_line_with_the_fix(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(UserError, match=f"token file {missing} does not exist; copy the head's token file"):
        ray_token.read_token(missing)
    shared = tmp_path / "shared"
    shared.write_text("abc\n")
    shared.chmod(0o644)
    with pytest.raises(UserError, match=f"open to other users \\(mode 644\\); chmod 600 {shared}"):
        ray_token.read_token(shared)
    empty = tmp_path / "empty"
    empty.write_text("\n")
    empty.chmod(0o600)
    with pytest.raises(UserError, match="holds no token"):
        ray_token.read_token(empty)


def test_with_token_drops_a_token_value_that_would_win(tmp_path):
    env = ray_token.with_token({"RAY_AUTH_TOKEN": "other", "RAY_AUTH_MODE": "disabled", "X": "1"}, tmp_path / "t")
    assert env == {"X": "1", "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(tmp_path / "t")}


def test_worker_environment_defaults_yield_to_the_user(monkeypatch):
    """Workers at nice 0 on every cluster; huge-page CPU tensors for trainer-only runs (no engine in the process);
    a value the user set wins over both."""
    monkeypatch.delenv("THP_MEM_ALLOC_ENABLE", raising=False)
    assert cl.with_worker_env({"PATH": "/bin"}) == {"RAY_worker_niceness": "0", "PATH": "/bin"}
    assert cl.with_worker_env({"RAY_worker_niceness": "5"})["RAY_worker_niceness"] == "5"
    assert cl.huge_pages_env(engine_in_workers=False) == {"THP_MEM_ALLOC_ENABLE": "1"}
    assert cl.huge_pages_env(engine_in_workers=True) == {}
    monkeypatch.setenv("THP_MEM_ALLOC_ENABLE", "0")
    assert cl.huge_pages_env(engine_in_workers=False) == {}


def test_side_ports_are_distinct_and_never_the_ports_named(monkeypatch):
    """`cluster up` names its GCS and dashboard ports and picks Ray's side ports: one port twice (CI saw the client
    server given the GCS port a test had just looked up) makes `ray start` fail."""
    from rlkit.controller import processes

    named = processes.free_ports(2)
    real_socket = processes.socket.socket
    handed = iter([*named, 50001, *named, 50001, 50002, 50003, 50004, 50005, 50002, 50006, 50007])

    class Replaying:  # a kernel that hands the named ports, and its own picks, out again
        def __init__(self, *args):
            self.sock = real_socket(*args)
            self.port = next(handed)

        def bind(self, address):
            pass

        def getsockname(self):
            return ("127.0.0.1", self.port)

        def close(self):
            self.sock.close()

    monkeypatch.setattr(processes.socket, "socket", Replaying)
    args = cl.side_port_args(avoid=tuple(named), client=True)
    ports = [int(a.split("=")[1]) for a in args]
    assert len(args) == 7 and "--ray-client-server-port" in args[-1]
    assert ports == [50001, 50002, 50003, 50004, 50005, 50006, 50007]
    monkeypatch.undo()
    picked = processes.free_ports(50)
    assert len(set(picked)) == 50  # each held until all are picked


def test_a_loopback_cluster_takes_no_token_file(tmp_path, monkeypatch):
    monkeypatch.setenv(cl.STATE_ENV, str(tmp_path / "cluster.json"))
    with pytest.raises(UserError, match="--token-file is for a cluster on the network"):
        cl.start_cluster(token_file=str(tmp_path / "t"))


# -- a real head with token auth -----------------------------------------------------------------
@dataclass
class Head:
    env: dict[str, str]  # the user's shell on the head: records in a private folder
    info: cl.ClusterInfo
    up_output: str
    token_file: Path
    dashboard_port: int
    temp_dir: str
    node_temp_dir: str


def cli(env: dict[str, str], *args: str, timeout: float = 180, input_: str | None = None):
    return subprocess.run([RLKIT, *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          input=input_)  # fmt: skip


@pytest.fixture(scope="module")
def head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Head]:
    root = tmp_path_factory.mktemp("secured")
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RLKIT_DASHBOARD", "RAY_AUTH_TOKEN")}
    env.pop("RAY_AUTH_TOKEN_PATH", None)
    env["RAY_AUTH_MODE"] = "disabled"  # as tests/conftest.py sets it: `cluster up --listen-all` turns auth on anyway
    env[cl.STATE_ENV] = str(root / "cluster.json")
    env["COLUMNS"] = "250"  # rich wraps long paths in table cells at 80
    temp_dir = tempfile.mkdtemp(prefix="rlk-a-", dir="/tmp")  # short: Ray puts Unix sockets in it
    node_temp_dir = tempfile.mkdtemp(prefix="rlk-n-", dir="/tmp")
    port, dashboard_port = free_ports(2)
    t0 = time.monotonic()
    up = cli(env, "cluster", "up", "--listen-all", "--num-cpus", "2", "--port", str(port),
             "--dashboard-port", str(dashboard_port), "--temp-dir", temp_dir)  # fmt: skip
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        print(f"\n[cluster up --listen-all] {time.monotonic() - t0:.0f}s")
        info = cl.read_record(root / "cluster.json")
        assert info is not None
        yield Head(env, info, up.stdout, root / "cluster_token", dashboard_port, temp_dir, node_temp_dir)
    finally:
        cli(env, "cluster", "down", timeout=60)
        stop_processes(node_temp_dir)
        stop_processes(temp_dir, gcs_port=port)
        shutil.rmtree(temp_dir, ignore_errors=True)
        shutil.rmtree(node_temp_dir, ignore_errors=True)


def _python(env: dict[str, str], code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env=env, cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip


def _finish(proc: subprocess.Popen, timeout: float = 120) -> str:
    out, _ = proc.communicate(timeout=timeout)
    return out


@pytest.mark.slow
def test_up_listen_all_makes_the_token_file_and_says_how_to_join(head: Head):
    info, out = head.info, flat(head.up_output)
    token = head.token_file.read_text().strip()
    assert info.token_file == str(head.token_file) and not info.loopback
    assert stat.S_IMODE(head.token_file.stat().st_mode) == 0o600
    assert token not in head.up_output  # only its path and fingerprint
    assert f"token file: {head.token_file} (0600, made now; fingerprint {ray_token.fingerprint(token)})" in out
    assert f"rlkit cluster join {info.address} --token-file FILE" in out
    assert f"RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH={head.token_file} python my.py" in out
    assert "with token auth on" in out and "/.ray/" not in info.token_file  # not Ray's default file (see ray_token)
    from tests.debug._sockets import listening

    dash = listening(None, port=head.dashboard_port)  # the dashboard stays on the head's loopback
    assert dash and all(s.loopback for s in dash), dash
    gcs = listening(None, port=info.gcs_port)
    assert gcs and not all(s.loopback for s in gcs), gcs  # the GCS is on the network: other nodes can join


@pytest.mark.slow
def test_dashboard_and_job_submission_need_the_token(head: Head):
    url = head.info.dashboard_url
    token = head.token_file.read_text().strip()
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{url}/api/version", timeout=10)
    assert refused.value.code == 401
    with pytest.raises(urllib.error.HTTPError) as wrong:
        urllib.request.urlopen(urllib.request.Request(f"{url}/api/version", headers=ray_token.bearer_header("0" * 64)))
    assert wrong.value.code == 403
    with urllib.request.urlopen(urllib.request.Request(f"{url}/api/version", headers=ray_token.bearer_header(token))):
        pass
    submit = f"""
        from ray.job_submission import JobSubmissionClient
        try:
            print("SUBMITTED", JobSubmissionClient({url!r}).submit_job(entrypoint="echo hi"))
        except Exception as exc:
            print("REFUSED", type(exc).__name__, str(exc).splitlines()[-1][:200])
    """
    without = _finish(_python(head.env, submit))  # RAY_AUTH_MODE=disabled, no token
    with_token = _finish(_python(ray_token.with_token(head.env, head.token_file), submit))
    assert "REFUSED" in without and "SUBMITTED" not in without, without
    assert "SUBMITTED raysubmit_" in with_token, with_token
    status = cli(head.env, "cluster", "status")  # the token from the `cluster up` record
    assert status.returncode == 0, status.stdout + status.stderr
    assert "auth" in status.stdout and str(head.token_file) in flat(status.stdout)


@pytest.mark.slow
def test_ray_init_without_the_token_is_refused_with_it_accepted(head: Head):
    address = head.info.address
    refused = _python(head.env, f"""
        import ray
        try:
            ray.init(address={address!r}, log_to_driver=False)
            print("CONNECTED")
        except ConnectionError as exc:
            print("REFUSED", exc)
    """)  # fmt: skip
    # rlkit's driver path (init_ray: choose_cluster + join_auth) with Ray already imported under RAY_AUTH_MODE=disabled
    accepted = _python(
        head.env,
        """
        import os, ray
        from rlkit.controller.cluster import choose_cluster
        from rlkit.controller.cluster_auth import join_auth
        target = choose_cluster()
        print("TOKEN FILE", join_auth(target))
        ray.init(address=target.address, log_to_driver=False)
        print("RESULT", ray.get(ray.remote(lambda: (os.environ.get("RAY_AUTH_MODE"), os.nice(0))).remote()))
    """,
    )
    t0 = time.monotonic()
    out_refused, out_accepted = _finish(refused), _finish(accepted)
    print(f"\n[ray.init without the token: refused, with it: accepted] {time.monotonic() - t0:.0f}s")
    assert "REFUSED Failed to connect to Ray cluster" in out_refused and "CONNECTED" not in out_refused, out_refused
    assert "InvalidAuthToken" in out_refused  # Ray's own reason, in its log lines
    assert f"TOKEN FILE {head.token_file}" in out_accepted and "RESULT ('token', 0)" in out_accepted, out_accepted
    # ("token", 0): the worker ran under the token and at the user's priority (Ray's own default is nice 15)


@pytest.mark.slow
def test_join_with_a_wrong_or_missing_token_fails_in_one_line(head: Head, tmp_path):
    bad = tmp_path / "bad_token"
    bad.write_text("0" * 64 + "\n")
    bad.chmod(0o600)
    env = {k: v for k, v in head.env.items() if k != cl.STATE_ENV}
    env[cl.STATE_ENV] = str(tmp_path / "node.json")  # the worker node's own records
    t0 = time.monotonic()
    wrong = cli(env, "cluster", "join", head.info.address, "--token-file", str(bad))
    took = time.monotonic() - t0
    lines = [line for line in wrong.stderr.splitlines() if line.strip()]
    assert wrong.returncode == 1 and len(lines) == 1, wrong.stdout + wrong.stderr
    assert f"error: the Ray head at {head.info.address} rejected the token from {bad};" in flat(wrong.stderr)
    assert "--token-file" in lines[0] and "Traceback" not in wrong.stdout + wrong.stderr
    assert took < 30, f"{took:.0f}s"  # Ray alone takes 20 s to give up, then prints a traceback
    assert not cluster_processes(cluster_join_temp_dir(head.info.address)), "a Ray process started anyway"
    print(f"\n[cluster join with a wrong token] exit 1 in {took:.1f}s: {lines[0]}")

    none = cli(env, "cluster", "join", head.info.address)
    assert none.returncode == 1 and "no token for the cluster: pass --token-file FILE" in flat(none.stderr)
    bad.chmod(0o644)
    shared = cli(env, "cluster", "join", head.info.address, "--token-file", str(bad))
    assert shared.returncode == 1 and f"chmod 600 {bad}" in flat(shared.stderr)
    loop = cli(env, "cluster", "join", f"127.0.0.1:{head.info.gcs_port}", "--token-file", str(head.token_file))
    assert loop.returncode == 1 and "is a loopback address" in flat(loop.stderr)


def cluster_join_temp_dir(address: str) -> str:
    from rlkit.controller.cluster_join import join_temp_dir

    return join_temp_dir(int(address.rsplit(":", 1)[1]))


@pytest.mark.slow
def test_debug_a_remote_head_through_forwarded_ports(head: Head, tmp_path):
    """The laptop's view: `ssh -L A:127.0.0.1:DASHBOARD head` and `ssh -L B:NODE_IP:DEBUGPY head`, a copy of the
    token file, no record of the cluster; rlkit's DAP client attaches through the forward."""
    from rlkit.debug.session import DebugSession

    driver = _python(
        head.env,
        """
        import ray, cloudpickle
        from rlkit.controller.cluster import choose_cluster
        from rlkit.controller.cluster_auth import join_auth
        from rlkit.debug import debug_runtime_env
        from tests.debug import _targets
        cloudpickle.register_pickle_by_value(_targets)
        target = choose_cluster()
        join_auth(target)
        ray.init(address=target.address, runtime_env=debug_runtime_env("on"), log_to_driver=False)
        policy = _targets.Policy.options(name="remote_policy").remote()
        print("RESULT", ray.get(policy.work.remote(6), timeout=300), flush=True)
    """,
    )
    laptop = {k: v for k, v in head.env.items() if k != cl.STATE_ENV}
    laptop[cl.STATE_ENV] = str(tmp_path / "laptop.json")  # the laptop knows no cluster
    copy = tmp_path / "head_token"
    shutil.copy(head.token_file, copy)
    copy.chmod(0o600)
    dash_fwd = Forward("127.0.0.1", head.dashboard_port)
    debug_fwd = None
    try:
        local = f"127.0.0.1:{dash_fwd.port}"
        listed, deadline = [], time.monotonic() + 180
        while not listed:
            assert driver.poll() is None, driver.communicate()[0]
            assert time.monotonic() < deadline, "no paused worker within 180 s"
            args = ["--json", "--no-where", "--dashboard", local, "--token-file", str(copy)]
            result = cli(laptop, "debug", "list", *args)
            assert result.returncode == 0, result.stdout + result.stderr
            listed = [w for w in json.loads(result.stdout) if w["actor_name"] == "remote_policy"]
            time.sleep(0.5)
        worker = listed[0]
        assert worker["ip"] == head.info.node_ip  # debugpy on the head's network address (multi-node)

        # Without the token: one line (the VS Code extension sends none: its query gets the same 401).
        refused = cli(laptop, "debug", "list", "--dashboard", local)
        assert refused.returncode == 1 and "needs the cluster's token (token auth is on)" in flat(refused.stderr)
        with pytest.raises(urllib.error.HTTPError) as extension:
            urllib.request.urlopen(f"http://{local}/api/v0/workers?detail=1", timeout=10)
        assert extension.value.code == 401

        debug_fwd = Forward(worker["ip"], worker["port"])
        session = DebugSession.attach("127.0.0.1", debug_fwd.port)
        try:
            top = session.stack()[0]
            assert top.name == "work" and top.path.endswith("_targets.py")
            assert session.evaluate("secret * 2 + x", top.id).value == "90"
        finally:
            session.detach()
        assert debug_fwd.connections >= 1
        assert "RESULT 43" in _finish(driver, timeout=60)
    finally:
        if driver.poll() is None:
            driver.kill()
        dash_fwd.close()
        if debug_fwd is not None:
            debug_fwd.close()


@pytest.mark.slow
def test_join_with_the_token_then_down_stops_node_and_head(head: Head, tmp_path):
    env = {**head.env, cl.STATE_ENV: str(tmp_path / "node.json")}  # the worker node's own records
    env = {k: v for k, v in env.items() if k != "RAY_AUTH_MODE"}
    copy = tmp_path / "head_token"
    shutil.copy(head.token_file, copy)
    copy.chmod(0o600)
    t0 = time.monotonic()
    joined = cli(env, "cluster", "join", head.info.address, "--token-file", str(copy), "--num-cpus", "1",
                 "--temp-dir", head.node_temp_dir)  # fmt: skip
    assert joined.returncode == 0, joined.stdout + joined.stderr
    print(f"\n[cluster join] {time.monotonic() - t0:.0f}s: {flat(joined.stdout)}")
    assert f"joined the Ray cluster at {head.info.address}" in flat(joined.stdout)
    assert copy.read_text().strip() not in joined.stdout + joined.stderr
    status = cli(head.env, "cluster", "status")
    assert status.returncode == 0, status.stdout + status.stderr
    assert flat(status.stdout).count(head.info.node_ip) >= 3  # the address row and two nodes
    assert cluster_processes(head.node_temp_dir)

    node_down = cli(env, "cluster", "down")
    assert node_down.returncode == 0, node_down.stdout + node_down.stderr
    assert f"worker node of the cluster at {head.info.address}: stopped it" in flat(node_down.stdout)
    assert not cluster_processes(head.node_temp_dir)
    down = cli(head.env, "cluster", "down")
    assert down.returncode == 0 and "stopped the Ray cluster at" in flat(down.stdout), down.stdout + down.stderr
    assert not cluster_processes(head.temp_dir) and head.token_file.exists()  # the token stays for the next `up`
