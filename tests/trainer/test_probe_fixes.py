"""What a bad-input probe found (issue 35, section 6), each checked in this process without Ray:

- a Ctrl-C that lands in a finalizer (`__del__`) is not lost: the watch delivers it again outside;
- --dry-run's pre-flight loads the data as the run does: a plain-string prompt column and prompts over
  data.max_prompt_length (truncation=error) fail with the dataset's own error;
- metrics.jsonl: a run that starts again drops the earlier run's rows; a resumed run logs no second row of its step;
- the console: step 0 is "validation before training"; tables in a log file keep whole paths;
- a failing scorer's traceback starts at the user's frame;
- --debug nan: the checks name the parameter with a NaN gradient, save the rows, and cost nothing when off.
"""

from __future__ import annotations

import io
import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch
from rich.console import Console

from rlkit.errors import UserError


# ------------------------------------------------------------------------------------------------- Ctrl-C
def test_an_interrupt_dropped_by_a_finalizer_is_delivered_again(capsys):
    from rlkit.trainer.run.interrupt import InterruptWatch

    class Finalized:
        def __del__(self) -> None:  # the signal arrives while this runs: Python drops the handler's exception
            os.kill(os.getpid(), signal.SIGINT)
            deadline = time.monotonic() + 0.5
            while time.monotonic() < deadline:
                pass

    after_finalizer = False
    with pytest.raises(KeyboardInterrupt), InterruptWatch() as watch:
        Finalized()
        after_finalizer = True
        for _ in range(10_000_000):  # the re-delivered interrupt lands here, at an ordinary bytecode
            pass
    assert watch.hit and after_finalizer
    assert "Exception ignored" not in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------ pre-flight
def _cfg(toy_data: Path, tiny_model: Path, tmp_path: Path, *extra: str):
    from rlkit.trainer.run.run_config import load_config
    from tests.trainer.conftest import toy_overrides

    return load_config("grpo", [*toy_overrides(toy_data, tiny_model, tmp_path), *extra])


def test_dry_run_preflight_runs_the_dataset_checks(toy_data, tiny_model, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rlkit.data import RLDataset
    from rlkit.models.loading import load_tokenizer
    from rlkit.trainer.run.preflight import preflight

    table = pq.read_table(toy_data / "train.parquet").to_pydict()
    table["prompt"] = [m[0]["content"] for m in table["prompt"]]  # a plain string, not a list of messages
    plain = tmp_path / "plain.parquet"
    pq.write_table(pa.table(table), plain)
    tokenizer = load_tokenizer(str(tiny_model))
    for extra, files, length in (([f"data.train_files={plain}"], plain, 32),
                                 (["data.max_prompt_length=4"], toy_data / "train.parquet", 4)):
        with pytest.raises(UserError) as run_error:  # what the run's dataset says, 11 s later with Ray up
            RLDataset(files, tokenizer, length, "error")
        with pytest.raises(UserError) as dry:
            preflight(_cfg(toy_data, tiny_model, tmp_path, *extra), allow_download=False)
        assert f"data.train_files: {run_error.value}" in str(dry.value)


# ------------------------------------------------------------------------------------------------ metrics.jsonl
class _Loader:
    epoch = 0

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def _trainer(tmp_path: Path, steps: int, resume_mode: str):
    from rlkit.config.schema import RLConfig
    from rlkit.trainer.run.trainer_base import TrainerBase

    class Counting(TrainerBase):
        def run_step(self):
            return {"critic/score/mean": float(self.global_step)}

        def validate(self):
            return {"val/score": 1.0}

        def save_state(self, folder):
            pass

        def load_state(self, folder):
            pass

    cfg = RLConfig()
    cfg.trainer.val_before_train, cfg.trainer.save_freq, cfg.trainer.resume_mode = True, 2, resume_mode
    trainer = Counting()
    trainer.cfg, trainer.train_loader, trainer.val_set, trainer.total_steps = cfg, _Loader(), [1], steps
    trainer.ckpt_root = tmp_path / "ckpt"
    return trainer


def _fit(tmp_path: Path, steps: int, resume_mode: str) -> list[int]:
    from rlkit.utils.tracking import Tracking

    trainer = _trainer(tmp_path, steps, resume_mode)
    with Tracking(["file"], log_dir=tmp_path / "logs", total_steps=steps) as tracker:
        trainer.tracker = tracker
        trainer.fit()
    return [json.loads(line)["step"] for line in (tmp_path / "logs" / "metrics.jsonl").open()]


def test_metrics_log_each_step_once_after_a_fresh_start_and_after_a_resume(tmp_path):
    assert _fit(tmp_path, 3, "disable") == [0, 1, 2, 3]  # validation before training is step 0
    assert _fit(tmp_path, 3, "disable") == [0, 1, 2, 3]  # started again: the first run's rows are gone
    assert _fit(tmp_path, 5, "auto") == [0, 1, 2, 3, 4, 5]  # resumed from step 3: no second row of step 3


# ------------------------------------------------------------------------------------------------ console
def test_console_names_step_0_and_keeps_paths_whole_in_a_log_file(tmp_path):
    from rlkit.trainer.run.run_summary import print_table
    from rlkit.utils.console_tracker import ConsoleTracker
    from rlkit.utils.tracker_base import RunInfo

    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=80)
    tracker = ConsoleTracker(RunInfo("p", "e", tmp_path, 2, {}), console=console)
    tracker.log({"val/score": 1.0}, step=0)
    tracker.log({"critic/score/mean": 0.5}, step=1)
    text = " ".join(out.getvalue().split())  # a narrow table wraps its title
    assert "validation before training" in text and "step 0" not in text and "step 1/2" in text
    from rich.table import Table

    path = "/a/rather/long/folder/name/that/would/be/folded/by/rich/at/eighty/columns/checkpoints/global_step_2"
    table = Table(title="run summary", show_header=False)
    table.add_column("what", no_wrap=True)
    table.add_column("value", overflow="fold")
    table.add_row("checkpoint", path)
    print_table(console, table)
    assert path in out.getvalue()


# ------------------------------------------------------------------------------------------------ custom reward
def _user_helper(x: str) -> float:
    return 1 / 0


def test_a_scorer_traceback_starts_at_the_users_frame():
    from rlkit.reward.manager import _run_with_timeouts

    [(kind, exc, tb)] = _run_with_timeouts([lambda: _user_helper("x")], workers=1, timeout_s=30)
    assert kind == "error" and isinstance(exc, ZeroDivisionError)
    frames = [line for line in tb.splitlines() if line.strip().startswith("File ")]
    assert __file__ in frames[0] and "rlkit/reward" not in tb and "_user_helper" in tb


# ------------------------------------------------------------------------------------------------ --debug nan
@pytest.fixture
def anomaly(tmp_path, monkeypatch):
    from rlkit.debug import anomaly as an

    monkeypatch.setenv(an.ANOMALY_ENV, "stop")
    monkeypatch.setenv(an.ANOMALY_DIR_ENV, str(tmp_path / "anomalies"))
    monkeypatch.setenv(an.ANOMALY_RUN_ENV, "/runs/r1")
    an.anomaly_mode.cache_clear()
    yield an
    an.anomaly_mode.cache_clear()
    an._local_origin.clear()


def test_nan_checks_name_the_parameter_and_save_the_rows(anomaly, tmp_path):
    from rlkit.debug import set_step
    from rlkit.protocol import Batch

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
    rows = Batch({"x": torch.ones(2, 4)}, {"uid": ["a", "b"]})
    set_step(3)
    model(rows["x"]).sum().backward()
    anomaly.check_gradients(model, rows, "actor")  # finite: nothing
    model[0].weight.grad[0, 0] = float("nan")
    with pytest.raises(anomaly.NonFiniteValue) as info:
        anomaly.check_gradients(model, rows, "actor")
    line = str(info.value)
    saved = tmp_path / "anomalies" / "step3_rank0_gradient.pt"
    assert line == (f"non-finite gradient actor of 0.weight at step 3, rank 0; 2 rows (sample ids a, b) saved to "
                    f"{saved}; replay the step with: rlkit debug replay /runs/r1 --step 3")
    assert torch.load(saved, weights_only=False).non_tensors["uid"].tolist() == ["a", "b"]
    with pytest.raises(anomaly.NonFiniteValue, match="non-finite loss actor \\(1 of 1 values\\) at step 3"):
        anomaly.check_tensor("loss", torch.tensor(float("inf")), rows, "actor")
    assert anomaly.line_in(f"Traceback...\nrlkit.debug.anomaly.NonFiniteValue: {line}\n") == line
    set_step(None)


def test_nan_checks_are_off_without_the_setting(monkeypatch):
    from rlkit.debug import anomaly as an

    monkeypatch.delenv(an.ANOMALY_ENV, raising=False)
    an.anomaly_mode.cache_clear()
    an.check_tensor("loss", torch.tensor(float("nan")))  # off: no check, no error
    untouchable = object()  # off, a check reads nothing: not the value, not the module's parameters
    an.check_tensor("loss", untouchable)  # type: ignore[arg-type]
    an.check_gradients(untouchable)  # type: ignore[arg-type]
    an.watch_gradient(untouchable, None)  # type: ignore[arg-type]
