"""`trainer.logger` in verl's forms (one name or a list), the mlflow tracker against a real local file store,
a tracker whose package is missing stopping the run at pre-flight, and validation generations per backend."""

from __future__ import annotations

import io
import json
import sys
import types

import pytest
from rich.console import Console

from rlkit.errors import UserError
from rlkit.trainer.run.run_config import load_config
from rlkit.utils.console_tracker import ConsoleTracker
from rlkit.utils.tracker_backends import MlflowTracker
from rlkit.utils.tracker_base import RunInfo
from rlkit.utils.tracking import Tracking, missing_tracker_packages

HF = ["actor_rollout_ref.rollout.name=hf"]
SAMPLES = [{"input": f"question {i}", "output": f"answer {i}", "score": float(i % 2)} for i in range(3)]


@pytest.mark.parametrize("value, expect", [
    ("console", ["console"]), ("[console,file]", ["console", "file"]), ("['console','mlflow']", ["console", "mlflow"]),
])
def test_logger_is_a_name_or_a_list(value, expect):
    assert load_config("grpo", [*HF, f"trainer.logger={value}"]).trainer.logger == expect


def test_an_unknown_logger_name_fails_at_load():
    with pytest.raises(UserError, match=r"trainer.logger='consol' is not registered"):
        load_config("grpo", [*HF, "trainer.logger=consol"])


def test_a_missing_tracker_package_fails_pre_flight_with_the_pip_command(monkeypatch):
    """The missing package is simulated: mlflow's tracker asks for a module name that does not exist."""
    from rlkit.trainer.run.preflight import Preflight, check_trackers

    monkeypatch.setattr(MlflowTracker, "packages", ("rlkit_no_such_package",))
    cfg = load_config("grpo", [*HF, "trainer.logger=[console,mlflow]"])
    report = Preflight(cfg)
    check_trackers(report)
    assert report.problems == [
        "trainer.logger: tracker 'mlflow' needs the rlkit_no_such_package package, which is not installed: "
        "pip install 'rlkit[tracking]' (or pip install mlflow), or drop 'mlflow' from trainer.logger"]
    assert missing_tracker_packages("console") == []


def test_a_tracker_whose_import_fails_is_one_line(tmp_path, monkeypatch):
    """Import failure simulated by a None entry in sys.modules (what `import mlflow` then raises)."""
    monkeypatch.setitem(sys.modules, "mlflow", None)
    assert "tracker 'mlflow' needs the mlflow package" in missing_tracker_packages(["mlflow"])[0]
    with pytest.raises(UserError, match=r"tracker 'mlflow' needs the mlflow package: pip install 'rlkit\[tracking\]'"):
        Tracking(["file", "mlflow"], log_dir=tmp_path)


def test_mlflow_logs_params_metrics_and_generations_to_a_local_store(tmp_path, monkeypatch):
    mlflow = pytest.importorskip("mlflow")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)  # set by the tracker; restored after the test
    config = {"trainer": {"project_name": "p", "logger": ["mlflow"]}, "actor": {"lr": 1e-6}}
    with Tracking("mlflow", project="proj", experiment="exp", log_dir=tmp_path, config=config) as t:
        t.log({"val/toy/pass@4": 0.5, "actor/pg_loss": [1.0, 3.0]}, step=1)
        t.log({"val/toy/pass@4": 0.75}, step=2)
        t.log_generations(SAMPLES, step=2)
        run_id = t.trackers[0].run_id
    client = mlflow.MlflowClient(tracking_uri=(tmp_path / "mlruns").resolve().as_uri())
    run = client.get_run(run_id)
    assert run.info.run_name == "exp" and run.info.status == "FINISHED"
    assert client.get_experiment(run.info.experiment_id).name == "proj"
    assert run.data.params["actor/lr"] == "1e-06" and run.data.params["trainer/logger"] == '["mlflow"]'
    history = client.get_metric_history(run_id, "val/toy/pass_at_4")  # verl's spelling of '@'
    assert [(m.step, m.value) for m in history] == [(1, 0.5), (2, 0.75)]
    assert run.data.metrics["actor/pg_loss"] == 2.0
    table = json.loads(next((tmp_path / "mlruns").rglob("val_generations/step_2.json")).read_text())
    assert table["columns"] == ["step", "input", "output", "score"]
    assert table["data"] == [[2, s["input"], s["output"], s["score"]] for s in SAMPLES]


def test_file_tracker_writes_the_generations_and_rewinds_them(tmp_path):
    with Tracking("file", log_dir=tmp_path) as t:
        t.log_generations(SAMPLES, step=0)
        t.log_generations(SAMPLES[:2], step=2)
        rows = [json.loads(x) for x in (tmp_path / "val_generations.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows] == [0, 0, 0, 2, 2]
        assert rows[1] == {"step": 0, "input": "question 1", "output": "answer 1", "score": 1.0}
        t.rewind(1)  # a resume from step 1 replays step 2: its rows go
    rows = [json.loads(x) for x in (tmp_path / "val_generations.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 0, 0]


def test_console_prints_a_few_generations(tmp_path):
    buf = io.StringIO()
    tracker = ConsoleTracker(RunInfo("p", "e", tmp_path, 2, {}), console=Console(file=buf, width=200))
    tracker.log_generations(SAMPLES + SAMPLES, step=4)
    out = buf.getvalue()
    assert out.count("val generation step 4") == 3 and "output: answer 2" in out


def test_tensorboard_gets_the_generations_as_text(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with Tracking("tensorboard", log_dir=tmp_path) as t:
        t.log_generations(SAMPLES, step=3)
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    [text] = events.Tensors("val/generations/text_summary")
    assert text.step == 3 and b"answer 2" in text.tensor_proto.string_val[0]


def test_swanlab_calls(tmp_path, monkeypatch):
    """swanlab is not installed here (its protobuf pin would change the environment): a stand-in module
    records what the tracker calls, with the names swanlab's API has."""
    calls: list[tuple] = []

    class Table:
        def add(self, headers, rows):
            calls.append(("table", headers, rows))

    fake = types.SimpleNamespace(
        init=lambda **kw: calls.append(("init", kw)), log=lambda data, step: calls.append(("log", data, step)),
        finish=lambda: calls.append(("finish",)), login=lambda key: calls.append(("login", key)),
        echarts=types.SimpleNamespace(Table=Table))
    monkeypatch.setitem(sys.modules, "swanlab", fake)
    monkeypatch.setenv("SWANLAB_MODE", "offline")
    monkeypatch.delenv("SWANLAB_API_KEY", raising=False)
    with Tracking(["swanlab"], project="proj", experiment="exp", log_dir=tmp_path, config={"a": 1}) as t:
        t.log({"x": 1.0}, step=1)
        t.log_generations(SAMPLES[:1], step=1)
    assert calls[0] == ("init", {"project": "proj", "experiment_name": "exp", "config": {"a": 1},
                                 "logdir": str(tmp_path / "swanlog"), "mode": "offline"})
    assert calls[1] == ("log", {"x": 1.0}, 1)
    assert calls[2] == ("table", ["step", "input", "output", "score"], [[1, "question 0", "answer 0", 0.0]])
    assert calls[3][0] == "log" and "val/generations" in calls[3][1] and calls[-1] == ("finish",)
