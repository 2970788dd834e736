"""The pieces behind `rlkit runs/show/top` that need no training run: the status file's writes (atomic, only on a
change), a follower of a growing metrics file, the Prometheus endpoint over real HTTP (loopback; a token when wider),
the run state of a driver that is gone, and the trackio tracker's pre-flight line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from rlkit.errors import UserError
from rlkit.runs.live import Follower
from rlkit.runs.prometheus import MetricsEndpoint, exposition, metric_name
from rlkit.runs.read import find_runs, run_state, summarize
from rlkit.runs.status import STATUS_FILE, PhaseTimer, RunStatus, read_status


def test_status_is_written_on_changes_only_and_ends_once(tmp_path):
    status = RunStatus(tmp_path, trainer="grpo", total=3).begin()
    first = (tmp_path / STATUS_FILE).stat().st_mtime_ns
    writes = []
    status.listeners.append(lambda data: writes.append(data["phase"]))
    status.phase("starting")  # unchanged: no write
    assert writes == [] and (tmp_path / STATUS_FILE).stat().st_mtime_ns == first
    timer_seconds: dict[str, float] = {}

    class Timer:
        seconds = timer_seconds

        def __call__(self, name):
            import contextlib

            return contextlib.nullcontext()

    timer = PhaseTimer(Timer(), status)
    with timer("gen"):
        assert read_status(tmp_path)["phase"] == "gen"
    with timer("gen"):  # the same phase again: no second write
        pass
    with status.phased("validate"):
        assert read_status(tmp_path)["phase"] == "validate"
    assert writes == ["gen", "validate", "gen"] and timer.seconds is timer_seconds
    status.logged({"critic/score/mean": 0.5}, 1)
    status.end(None)
    status.end(ValueError("later"))  # the first end counts
    data = read_status(tmp_path)
    assert (data["state"], data["step"], data["total"], data["trainer"]) == ("finished", 1, 3, "grpo")
    assert data["pid"] == os.getpid() and not list(tmp_path.glob(".*tmp*"))  # renamed into place, nothing left


def test_a_failed_run_keeps_its_one_line_and_an_interrupt_is_not_a_failure(tmp_path):
    failed = RunStatus(tmp_path / "a").begin()
    failed.end(UserError("data.train_files: no such file\nmore"))
    assert read_status(tmp_path / "a")["error"] == "UserError: data.train_files: no such file"
    stopped = RunStatus(tmp_path / "b").begin()
    stopped.end(RuntimeError("a worker died of the same Ctrl-C"), interrupted=True)
    assert read_status(tmp_path / "b")["state"] == "interrupted"


def test_a_running_status_whose_driver_is_gone_reads_as_interrupted(tmp_path):
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(proc.stdout)
    status = RunStatus(tmp_path / "run").begin()
    assert run_state(read_status(tmp_path / "run"), []) == "running"  # this process: alive
    status.data["pid"] = dead_pid
    status.update(phase="gen")
    assert run_state(read_status(tmp_path / "run"), []) == "interrupted"
    assert summarize(tmp_path / "run").status == "interrupted"


def test_find_runs_skips_checkpoint_and_log_folders(tmp_path):
    for run in ("a", "b/c"):
        RunStatus(tmp_path / run).begin()
        (tmp_path / run / "global_step_1").mkdir()
        (tmp_path / run / "global_step_1" / STATUS_FILE).write_text("{}")  # never entered
    old = tmp_path / "old"  # a run from before status files: its metrics file makes it one
    (old / "logs").mkdir(parents=True)
    (old / "logs" / "metrics.jsonl").write_text(json.dumps({"step": 1, "critic/score/mean": 0.25}) + "\n")
    assert find_runs(tmp_path) == [tmp_path / "a", tmp_path / "b" / "c", old]
    row = summarize(old, tmp_path)
    assert (row.name, row.status, row.step, row.reward) == ("old", "unknown", 1, 0.25)
    with pytest.raises(UserError, match="no such folder"):
        find_runs(tmp_path / "nope")


def test_follower_reads_only_what_was_appended_and_restarts_on_a_rewind(tmp_path):
    path = tmp_path / "metrics.jsonl"
    follower = Follower(path)
    assert not follower.poll()  # no file yet
    path.write_text('{"step": 1}\n{"step": 2}\n{"st')  # a torn last line, being written
    assert follower.poll() and [r["step"] for r in follower.rows] == [1, 2]
    with open(path, "a") as f:
        f.write('ep": 3}\n')
    assert follower.poll() and [r["step"] for r in follower.rows] == [1, 2, 3]
    assert not follower.poll()
    path.write_text('{"step": 1}\n')  # rewound by a resume: shorter
    assert follower.poll() and [r["step"] for r in follower.rows] == [1]


def _get(url: str, token: str | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_prometheus_endpoint_serves_the_status_and_last_metrics_on_loopback():
    endpoint = MetricsEndpoint("127.0.0.1", 0).start()
    try:
        endpoint.set_status({"step": 3, "total": 10, "state": "running", "phase": "gen", "updated_at": 5.0})
        endpoint.set_row({"critic/score/mean": 0.5, "val/x/score/mean@1": 0.25, "note": "text"}, 3)
        code, text = _get(endpoint.url)
        assert code == 200
        lines = text.splitlines()
        for line in ("rlkit_step 3.0", "rlkit_total_steps 10.0", 'rlkit_state{state="running"} 1.0',
                     'rlkit_state{state="failed"} 0.0', 'rlkit_phase{phase="gen"} 1.0', "rlkit_critic_score_mean 0.5",
                     "rlkit_val_x_score_mean_at_1 0.25", "# TYPE rlkit_critic_score_mean gauge"):
            assert line in lines, text
        assert "note" not in text
        assert _get(endpoint.url.replace("/metrics", "/other"))[0] == 404
    finally:
        endpoint.stop()


def test_prometheus_endpoint_beyond_loopback_needs_a_token():
    with pytest.raises(UserError, match="needs a token|set a token"):
        MetricsEndpoint("0.0.0.0", 0)
    endpoint = MetricsEndpoint("0.0.0.0", 0, token="s3cret").start()
    try:
        url = f"http://127.0.0.1:{endpoint.port}/metrics"
        assert _get(url)[0] == 401 and _get(url, "wrong")[0] == 401
        code, text = _get(url, "s3cret")
        assert code == 200 and "rlkit_step" in text
    finally:
        endpoint.stop()


def test_metric_names_and_exposition_drop_non_finite_values():
    assert metric_name("actor/pg_loss") == "rlkit_actor_pg_loss"
    assert metric_name("val-core/a.b/acc/mean@4") == "rlkit_val_core_a_b_acc_mean_at_4"
    text = exposition({"state": "finished"}, {"a": float("nan"), "b": 1.0})
    assert "rlkit_b 1.0" in text and "rlkit_a" not in text and 'rlkit_state{state="finished"} 1.0' in text


def test_trackio_is_a_tracker_whose_missing_package_is_one_line():
    from rlkit.utils.tracker_base import importable
    from rlkit.utils.tracking import TRACKERS, missing_tracker_packages

    assert "trackio" in TRACKERS
    problems = missing_tracker_packages(["console", "trackio"])
    if importable("trackio"):
        assert problems == []
    else:
        assert problems == ["trainer.logger: tracker 'trackio' needs the trackio package, which is not installed: "
                            "pip install trackio, or drop 'trackio' from trainer.logger"]



def test_the_worker_list_is_read_again_at_each_write(tmp_path):
    """A worker restart replaces the processes: the next phase's write lists the new pids."""
    pids = [101]
    status = RunStatus(tmp_path, workers=lambda: [{"group": "g", "roles": ["actor"], "rank": 0, "pid": p}
                                                  for p in pids]).begin()
    assert [w["pid"] for w in read_status(tmp_path)["workers"]] == [101]
    pids[0] = 202
    status.phase("gen")
    assert [w["pid"] for w in read_status(tmp_path)["workers"]] == [202]
