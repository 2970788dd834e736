"""The console tracker as users read it: one line per step in a log file, no "critic" row without a
critic, a progress bar (or throttled lines) for long phases such as validation."""

from __future__ import annotations

import io
import re

from rich.console import Console

from rlkit.utils import console_tracker
from rlkit.utils.console_tracker import ConsoleTracker, console_group
from rlkit.utils.tracker_base import RunInfo
from rlkit.utils.tracking import Tracking

GRPO = {  # what a GRPO step logs: the field's names put reward statistics under critic/
    "critic/score/mean": 0.5, "critic/rewards/mean": 0.5, "critic/advantages/mean": 0.0,
    "actor/pg_loss": 0.1, "timing_s/step": 1.0, "val/toy/score/mean@1": 0.25,
}


def _console(terminal: bool) -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, force_terminal=terminal, width=120, color_system=None), buf


def _plain(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)


def test_each_step_line_appears_once_in_a_log_file():
    console, buf = _console(terminal=False)
    tracker = ConsoleTracker(RunInfo("p", "e", log_dir=None, total_steps=3, config={}), console=console)
    for step in (1, 2, 3):
        tracker.log(GRPO, step)
    tracker.finish()
    lines = buf.getvalue().splitlines()
    for step in (1, 2, 3):
        starts = [ln for ln in lines if ln.startswith(f"step {step}/3")]
        assert len(starts) == 1, lines
        assert "elapsed" in starts[0]
    assert "eta" in next(ln for ln in lines if ln.startswith("step 3/3"))


def test_no_critic_row_without_a_critic():
    console, buf = _console(terminal=False)
    tracker = ConsoleTracker(RunInfo("p", "e", log_dir=None, total_steps=2, config={}), console=console)
    tracker.log(GRPO, 1)
    tracker.log({**GRPO, "critic/vf_loss": 0.3}, 2)  # PPO: a value model exists
    first, second = buf.getvalue().split("step 2/2")
    rows = [ln.split()[0] for ln in first.splitlines()[1:] if ln.strip()]
    assert "critic" not in rows and "reward" in rows
    assert re.search(r"^\s*reward\s+score/mean 0.5\s+rewards/mean 0.5\s+advantages/mean 0", first, re.M)
    assert re.search(r"^\s*critic\s+vf_loss 0.3\s*$", second, re.M)
    assert console_group("critic/score/mean") == ("reward", "score/mean")
    assert console_group("actor/pg_loss") == ("actor", "pg_loss")


def test_validation_progress_on_a_terminal_is_a_bar_with_eta():
    console, buf = _console(terminal=True)
    with Tracking("console", total_steps=4) as tracker:
        tracker.trackers = [ConsoleTracker(RunInfo("p", "e", None, 4, {}), console=console)]
        for done in (0, 132, 264, 396):
            tracker.progress("validation prompts", done, 1319)
            tracker.trackers[0]._progress.refresh()
        out = _plain(buf.getvalue())
        tracker.progress("validation prompts", 1319, 1319)  # done: the bar goes away
        assert "validation prompts" not in [t.description for t in tracker.trackers[0]._progress.tasks]
    assert re.search(r"validation prompts .*396/1319 .*eta", out), out[-500:]


def test_validation_progress_in_a_log_file_is_throttled(monkeypatch):
    console, buf = _console(terminal=False)
    tracker = ConsoleTracker(RunInfo("p", "e", None, 4, {}), console=console)
    for done in (0, 600, 1319):  # fast: nothing at all
        tracker.progress("validation prompts", done, 1319)
    assert buf.getvalue() == ""
    monkeypatch.setattr(console_tracker, "PROGRESS_EVERY_S", 0.0)  # slow: a line per update, then the end
    for done in (0, 600, 1319):
        tracker.progress("validation prompts", done, 1319)
    lines = buf.getvalue().splitlines()
    assert lines[0].startswith("validation prompts 600/1319  elapsed") and "eta" in lines[0]
    assert lines[1].startswith("validation prompts 1319/1319  elapsed") and "eta" not in lines[1]


def test_the_facade_forwards_progress_only_to_backends_that_show_it(tmp_path):
    with Tracking(["jsonl"], log_dir=tmp_path, total_steps=2) as tracker:
        tracker.progress("validation prompts", 1, 2)  # the jsonl backend has no progress: no error
