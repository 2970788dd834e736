"""Trackers: jsonl/tensorboard files, console rendering, metric reduction, the facade."""

from __future__ import annotations

import io
import json
import math

import numpy as np
import pytest
import torch
from rich.console import Console

from rlkit.errors import UserError
from rlkit.utils.console_tracker import ConsoleTracker, select_keys
from rlkit.utils.tracker_base import TRACKERS, RunInfo, to_floats
from rlkit.utils.tracking import Tracking

METRICS = {
    "actor/pg_loss": 0.125,
    "actor/kl_loss": torch.tensor(0.002),
    "critic/score/mean": [0.0, 1.0, 1.0, 0.0],  # per-sample values from Batch meta
    "response_length/mean": np.float32(57.0),
    "timing_s/gen": 1.5,
    "val/gsm8k/acc/mean@1": 0.25,
    "misc/ignored_by_console": 3,
    "note": "text is dropped",
}


def test_to_floats():
    out = to_floats({**METRICS, "empty": [], "arr": np.array([1.0, 3.0]), "flag": True, "nan": float("nan")})
    assert out["critic/score/mean"] == 0.5 and out["arr"] == 2.0 and out["flag"] == 1.0
    assert out["actor/kl_loss"] == pytest.approx(0.002) and isinstance(out["response_length/mean"], float)
    assert "note" not in out and "empty" not in out and math.isnan(out["nan"])


def test_jsonl_writes_one_line_per_step_and_flushes(tmp_path):
    tracking = Tracking(["jsonl"], log_dir=tmp_path)
    tracking.log(METRICS, step=1)
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()  # readable before finish: flushed
    assert len(lines) == 1
    tracking.log({"actor/pg_loss": float("inf")}, step=2)
    tracking.finish()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["step"] == 1 and rows[0]["critic/score/mean"] == 0.5 and "note" not in rows[0]
    assert rows[1] == {"step": 2, "time": rows[1]["time"], "actor/pg_loss": None}


def test_file_and_jsonl_are_one_backend(tmp_path):
    with Tracking(["file", "jsonl"], log_dir=tmp_path) as tracking:
        tracking.log({"a": 1.0}, step=1)
    assert len(tracking.trackers) == 1
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 1


def test_tensorboard_writes_event_file(tmp_path):
    pytest.importorskip("tensorboard")
    with Tracking(["tensorboard"], log_dir=tmp_path, config={"lr": 1e-6}) as tracking:
        tracking.log(METRICS, step=1)
    events = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert acc.Scalars("critic/score/mean")[0].value == 0.5


def test_rewind_drops_replayed_rows_from_jsonl(tmp_path, caplog):
    """After a resume from step 2, steps 3.. run again: their old rows go, so each step appears once."""
    with Tracking(["jsonl"], log_dir=tmp_path) as first:
        for step in (1, 2, 3, 4):
            first.log({"x": step}, step=step)
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 5, "x": ')  # torn by a kill mid-write
    with Tracking(["jsonl"], log_dir=tmp_path) as resumed:
        resumed.rewind(2)
        resumed.log({"x": 30}, step=3)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["x"]) for r in rows] == [(1, 1), (2, 2), (3, 30)]
    assert "dropped 3 rows logged after step 2" in caplog.text


def test_rewind_purges_tensorboard_events_after_the_step(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with Tracking(["tensorboard"], log_dir=tmp_path) as first:
        for step in (1, 2, 3):
            first.log({"x": float(step)}, step=step)
    with Tracking(["tensorboard"], log_dir=tmp_path) as resumed:
        resumed.rewind(1)
        resumed.log({"x": 20.0}, step=2)
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("x")] == [(1, 1.0), (2, 20.0)]


def make_console(terminal: bool) -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, force_terminal=terminal, width=120, color_system=None), buf


@pytest.mark.parametrize("terminal", [True, False])
def test_console_renders(terminal):
    console, buf = make_console(terminal)
    run = RunInfo("proj", "exp", log_dir=None, total_steps=10, config={})
    tracker = ConsoleTracker(run, console=console)
    reduced = to_floats(METRICS)
    for step in (1, 2):
        tracker.log(reduced, step)
    tracker.finish()
    out = buf.getvalue()
    assert "step 2/10" in out and "pg_loss" in out and "score/mean 0.5" in out
    assert "gsm8k/acc/mean@1" in out and "ignored_by_console" not in out
    if not terminal:
        assert "eta" in out


def test_console_groups_and_falls_back():
    assert select_keys({"timing_s/gen": 1, "actor/pg_loss": 2}, ["actor/*", "timing_s/*"]) == [
        "actor/pg_loss", "timing_s/gen"]
    assert select_keys({"custom/x": 1.0}, ["actor/*"]) == ["custom/x"]


def test_console_through_facade(capsys):
    with Tracking("console", total_steps=3) as tracking:
        tracking.log(METRICS, step=1)
    assert "pg_loss" in capsys.readouterr().out


def test_unknown_backend_names_the_choices(tmp_path):
    with pytest.raises(UserError, match=r"unknown tracker 'tensorbord'.*Did you mean 'tensorboard'"):
        Tracking(["console", "tensorbord"], log_dir=tmp_path)
    assert not (tmp_path / "metrics.jsonl").exists()


def test_wandb_missing_is_a_clear_error(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "wandb", None)  # import fails as if not installed
    with pytest.raises(UserError, match=r"pip install 'rlkit\[wandb\]'"):
        Tracking(["jsonl", "wandb"], log_dir=tmp_path)


def test_registry_names():
    assert {"console", "jsonl", "file", "tensorboard", "wandb"} <= set(TRACKERS.names())
