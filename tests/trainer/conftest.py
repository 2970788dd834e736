"""Fixtures for the trainer tests: the toy copy task and a tiny tied-embedding model, built locally."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def toy_data(tmp_path_factory) -> Path:
    """`rlkit data toy --length 1`: "copy the digits : 7" -> "7" (2048 train rows, 128 test rows)."""
    from typer.testing import CliRunner

    from rlkit_cli.main import app

    out = tmp_path_factory.mktemp("toy")
    res = CliRunner().invoke(app, ["data", "toy", "--out", str(out), "--length", "1"])
    assert res.exit_code == 0, res.output
    assert (out / "train.parquet").is_file() and (out / "test.parquet").is_file()
    return out


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """A random 2-layer Llama (hidden 64) with tied embeddings: its built-in copy bias makes the toy task
    learnable by RL from scratch in ~100-200 steps."""
    from rlkit.testing import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("model") / "tiny", tie_embeddings=True)


def toy_overrides(data: Path, model: Path, out: Path, **extra) -> list[str]:
    """key=value overrides of a small toy run; `extra` uses `__` for dots (trainer__save_freq=1)."""
    values = {
        "data.train_files": data / "train.parquet",
        "data.max_prompt_length": 32,
        "data.max_response_length": 3,
        "data.train_batch_size": 16,
        "actor_rollout_ref.model.path": model,
        "actor_rollout_ref.rollout.name": "hf",
        "actor_rollout_ref.rollout.n": 8,
        "actor_rollout_ref.actor.ppo_mini_batch_size": 16,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 64,
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": 64,
        "actor_rollout_ref.actor.optim.lr": 5e-3,
        "trainer.default_local_dir": out / "ckpt",
        "trainer.log_dir": out / "logs",
        "trainer.resume_mode": "disable",
        "trainer.logger": "[file]",
        "trainer.n_gpus_per_node": 1,
        "trainer.cpus_per_worker": 1,
        "trainer.val_before_train": False,
    }
    values.update({k.replace("__", "."): v for k, v in extra.items()})
    return [f"{k}={v}" for k, v in values.items()]


def learning_overrides(data: Path, model: Path, out: Path, steps: int, **extra) -> list[str]:
    """`toy_overrides` of a learning run: batches of 32 prompts, `steps` steps, validation before and after."""
    values = dict(
        data__val_files=data / "test.parquet",
        data__train_batch_size=32,
        actor_rollout_ref__actor__ppo_mini_batch_size=32,
        trainer__total_training_steps=steps,
        trainer__val_before_train=True,
    )
    return toy_overrides(data, model, out, **(values | extra))


def read_metrics(log_dir: Path) -> list[dict]:
    path = Path(log_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def train_rows(rows: list[dict]) -> list[dict]:
    """Rows of training steps (validation-only rows, e.g. before the first step, have no score)."""
    return [r for r in rows if "critic/score/mean" in r]


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)  # `rlkit train` then starts its own local Ray, never joins another
    env.update(
        RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0", TOKENIZERS_PARALLELISM="false",
        PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""), COLUMNS="200",
    )
    return env


def rlkit_cmd(*args: str) -> list[str]:
    """The `rlkit` entry point next to this interpreter (as a user runs it), else the same via -c."""
    script = Path(sys.executable).with_name("rlkit")
    if script.is_file():
        return [str(script), *args]
    return [sys.executable, "-c", "from rlkit_cli.main import main; main()", *args]


def run_cli(*args: str, timeout: float = 300, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        rlkit_cmd(*args), capture_output=True, text=True, timeout=timeout, env=cli_env(), cwd=REPO, **kwargs
    )


def ensure_ray():
    """The same local Ray as the `ray_local` fixture, for module-scoped fixtures (which cannot use it)."""
    import ray

    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    return ray


def fit(algo: str, overrides: list[str], log_dir: Path, keep_state: bool = False, expect: type | None = None):
    """Run the trainer on the config (its rollout source: sync, one-step-off or fully async) in this process, on
    the shared local Ray; `expect`: the rollout source class it must use. Returns (summary, metrics rows, actor
    weights)."""
    from rlkit.trainer.run.run_config import load_config
    from rlkit.trainer.step.rl_trainer import RLTrainer
    from rlkit.utils.tracking import Tracking

    ensure_ray()
    cfg = load_config(algo, overrides)
    with Tracking(["file"], log_dir=log_dir) as tracker:
        trainer = RLTrainer(cfg, tracker=tracker)
        if expect is not None:
            assert isinstance(trainer.source, expect), f"{type(trainer.source).__name__}, expected {expect.__name__}"
        try:
            summary = trainer.fit()
            state = trainer.workers.actor.full_state_dict()[0] if keep_state else None
        finally:
            trainer.workers.shutdown()
    return summary, read_metrics(log_dir), state


def learning_curve(summary, rows: list[dict], steps: int, label: str) -> tuple[float, float, str]:
    """(mean train reward of the first 10 steps, of the last 20, the greedy-validation key) of a toy learning run,
    after checking it ran `steps` steps; prints the line the learning tests report."""
    import statistics

    scores = [r["critic/score/mean"] for r in train_rows(rows)]
    assert len(scores) == steps == summary.steps
    first, last = statistics.fmean(scores[:10]), statistics.fmean(scores[-20:])
    val_key = "val/rlkit/toy_copy/score/mean@1"
    print(f"{label} train reward first 10 {first:.3f} -> last 20 {last:.3f}; greedy val "
          f"{summary.first_val[val_key]:.3f} -> {summary.last_val[val_key]:.3f}; "
          f"median step {statistics.median(summary.step_seconds):.2f}s")
    return first, last, val_key
