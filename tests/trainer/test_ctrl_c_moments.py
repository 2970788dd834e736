"""A real SIGINT to a real `rlkit train` process group at two moments of start-up: while the config loads, and while
Ray and the workers start. Each must exit 130 with one `interrupted ...` line, no traceback and no process left
(bench/ctrl_c.py, which also runs the 20-random-moment version over start-up and training; a SIGINT in training is
tests/trainer/test_no_lost_runs.py's)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.trainer.conftest import REPO, cli_env

MOMENTS = ("1.5", "@starting Ray+2")


@pytest.mark.slow
def test_ctrl_c_during_start_up_stops_once_with_130_and_no_process_left(tmp_path):
    out = tmp_path / "ctrl_c.json"
    cmd = [sys.executable, "bench/ctrl_c.py", "--at", ",".join(MOMENTS), "--out", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=cli_env(), cwd=REPO)
    results = json.loads(out.read_text())["results"] if out.is_file() else []
    assert res.returncode == 0 and len(results) == len(MOMENTS), res.stdout[-3000:] + res.stderr[-2000:]
    for r in results:
        assert not r["finished_before_signal"] and r["rc"] == 130 and r["interrupted_lines"] == 1, r
        assert not r["traceback"] and not r["left_processes"], r
    lines = [r["last_line"] for r in results]
    assert lines[0].startswith("interrupted before ") and lines[1].startswith("interrupted before training started")
