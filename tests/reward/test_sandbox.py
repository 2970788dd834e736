"""Sandbox: limits hold, isolation is what `sandbox_capabilities()` reports, the test process is untouched."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from rlkit.sandbox import SandboxJob, SandboxLimits, run_many, run_program, sandbox_capabilities

CAPS = sandbox_capabilities()


def test_correct_program_and_stdin():
    res = run_program("a, b = map(int, input().split())\nprint(a + b)", stdin="2 3\n")
    assert res.status == "ok" and res.returncode == 0
    assert res.stdout.strip() == "5"


def test_runtime_and_syntax_errors():
    assert run_program("raise ValueError('boom')").status == "runtime_error"
    assert run_program("import sys; sys.exit(3)").returncode == 3
    assert run_program("def f(:\n    pass").status == "syntax_error"


def test_infinite_loop_is_killed_within_the_limit():
    start = time.monotonic()
    res = run_program("while True:\n    pass", limits=SandboxLimits(wall_s=1.0))
    assert res.status == "timeout"
    assert time.monotonic() - start < 3.0


def test_sleeping_program_hits_the_wall_limit():
    res = run_program("import time\ntime.sleep(60)", limits=SandboxLimits(wall_s=0.5))
    assert res.status == "timeout" and res.wall_s < 2.0


def test_memory_bomb_is_stopped():
    res = run_program("x = []\nwhile True:\n    x.append(bytearray(10 << 20))", limits=SandboxLimits(memory_mb=256))
    assert res.status == "memory"


def test_output_flood_is_capped():
    start = time.monotonic()
    res = run_program("while True:\n    print('x' * 1000)", limits=SandboxLimits(output_bytes=100_000, wall_s=5))
    assert res.status == "output_limit"
    assert len(res.stdout) <= 100_000
    assert time.monotonic() - start < 3.0


def test_big_file_is_refused():
    res = run_program("open('big', 'wb').write(b'x' * (8 << 20))", limits=SandboxLimits(file_mb=1))
    assert res.status == "runtime_error" and "File too large" in res.stderr


def test_scratch_dir_is_cwd_home_and_tmp_and_is_deleted():
    code = "import os, tempfile\nopen('f.txt', 'w').write('hi')\n"
    code += "print(os.getcwd(), os.environ['HOME'], tempfile.gettempdir())"
    res = run_program(code)
    cwd, home, tmp = res.stdout.split()
    assert cwd == home == tmp
    assert not Path(cwd).exists()  # deleted after the run


def test_environment_is_stripped(monkeypatch):
    monkeypatch.setenv("RLKIT_SECRET_TOKEN", "hunter2")
    res = run_program("import os; print(sorted(os.environ))")
    assert "RLKIT_SECRET_TOKEN" not in res.stdout


def test_writing_outside_scratch_fails(tmp_path):
    target = tmp_path / "escaped.txt"
    res = run_program(f"open({str(target)!r}, 'w').write('x')")
    if not CAPS["readonly_fs"] and not CAPS["unprivileged_uid"]:
        pytest.skip(f"no read-only view or uid drop on this machine: {CAPS}")
    assert res.status == "runtime_error"
    assert not target.exists()


def test_no_network():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    code = f"import socket\ns = socket.socket()\ns.settimeout(1)\ns.connect(('127.0.0.1', {port}))\nprint('connected')"
    try:
        res = run_program(code)
    finally:
        server.close()
    if not CAPS["network_isolated"]:
        assert "connected" in res.stdout  # honest report: nothing blocks the network here
        pytest.skip(f"no network namespace on this machine: {CAPS}")
    assert res.status == "runtime_error" and "connected" not in res.stdout


def test_fork_bomb_is_capped_and_leaves_nothing_behind():
    code = (
        "import os, time\nn = 0\nfor _ in range(1000):\n    try:\n        pid = os.fork()\n"
        "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(60)\n        os._exit(0)\n"
        "    n += 1\nprint(n, flush=True)\n"
    )
    start = time.monotonic()
    res = run_program(code, limits=SandboxLimits(wall_s=10, nproc=32))
    assert time.monotonic() - start < 8.0  # children die with the run, not at their sleep's end
    if not CAPS["nproc_limit"]:
        pytest.skip(f"no process limit on this machine: {CAPS}")
    assert res.status == "ok" and int(res.stdout) < 32
    uid = res.enforced["uid"]
    time.sleep(0.2)
    left = [p for p in os.listdir("/proc") if p.isdigit() and _uid_of(p) == uid]
    assert left == []


def _uid_of(pid: str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def test_run_many_keeps_order_and_runs_in_parallel():
    jobs = [SandboxJob(f"import time; time.sleep(0.5); print({i})") for i in range(4)]
    start = time.monotonic()
    results = run_many(jobs, max_workers=4)
    assert [r.stdout.strip() for r in results] == ["0", "1", "2", "3"]
    assert time.monotonic() - start < 1.8


def test_capabilities_report():
    for key in ("wall_timeout", "output_cap", "rlimit_cpu", "rlimit_as", "network_isolated", "readonly_fs"):
        assert isinstance(CAPS[key], bool)
    assert CAPS["probe_status"] == "ok"
    assert CAPS["scratch_cwd_home"]


def test_test_process_is_untouched():
    cwd, env = os.getcwd(), dict(os.environ)
    run_program("import os\nos.chdir('/')\nos.environ['X'] = '1'")
    assert os.getcwd() == cwd and dict(os.environ) == env
